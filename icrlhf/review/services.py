from collections.abc import Sequence

from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from icrlhf.generation.models import Candidate, Generation
from icrlhf.memory import services as memory_services
from icrlhf.queues.models import Item
from icrlhf.review.models import Decision

MAX_COMMENT_CHARS = 5_000


class DecisionConflict(Exception):
    """The item cannot take this decision any more (already decided, or not ready)."""


@transaction.atomic
def decision_record(
    *,
    item_id: int,
    reviewer: User,
    verdict: str,
    candidate_id: int | None = None,
    final_text: str = "",
    reason_tags: Sequence[str] = (),
    comment: str = "",
    time_to_decide_ms: int | None = None,
) -> Decision:
    """Record a verdict on the item's latest generation, with its rewarded examples.

    The item moves ready → decided with a conditional UPDATE, so of two concurrent decisions
    exactly one wins; the other gets DecisionConflict and nothing of it is written.
    """
    item = Item.objects.select_related("queue").get(pk=item_id)
    generation = item.generations.order_by("-created_at").first()
    if generation is None:
        raise DecisionConflict("This item has no candidates to decide on yet.")
    chosen = _candidate_for(verdict=verdict, candidate_id=candidate_id, generation=generation)
    if verdict == Decision.Verdict.EDITED:
        assert chosen is not None
        final_text = final_text.strip()
        if not final_text:
            raise ValidationError("The edited answer is empty. Write the answer, or pick one.")
        if len(final_text) > settings.ITEM_INPUT_MAX_CHARS:
            raise ValidationError(
                f"The edited answer is longer than {settings.ITEM_INPUT_MAX_CHARS:,} characters."
            )
        if final_text == chosen.text.strip():
            verdict = Decision.Verdict.CHOSEN  # Nothing was changed: it is a pick.
    if verdict == Decision.Verdict.CHOSEN:
        assert chosen is not None
        final_text = chosen.text
    if verdict == Decision.Verdict.NONE_ACCEPTABLE:
        final_text = ""
    if len(comment) > MAX_COMMENT_CHARS:
        raise ValidationError(f"The comment is longer than {MAX_COMMENT_CHARS:,} characters.")

    moved = Item.objects.filter(pk=item_id, status=Item.Status.READY).update(
        status=Item.Status.DECIDED, updated_at=timezone.now()
    )
    if not moved:
        item.refresh_from_db(fields=["status"])
        if item.status == Item.Status.DECIDED:
            raise DecisionConflict("This item has already been decided; your choice was not saved.")
        raise DecisionConflict(
            f"This item is {item.get_status_display().lower()}, so it cannot be decided now."
        )
    decision = Decision.objects.create(
        item=item,
        generation=generation,
        reviewer=reviewer,
        verdict=verdict,
        chosen_candidate=chosen,
        final_text=final_text,
        reason_tags=list(reason_tags),
        comment=comment.strip(),
        guideline_version=item.queue.guidelines_version,
        time_to_decide_ms=time_to_decide_ms,
    )
    memory_services.examples_record(decision=decision)
    return decision


def _candidate_for(
    *, verdict: str, candidate_id: int | None, generation: Generation
) -> Candidate | None:
    if verdict not in Decision.Verdict.values:
        raise ValidationError(f"Unknown verdict {verdict!r}.")
    if verdict == Decision.Verdict.NONE_ACCEPTABLE:
        return None
    if candidate_id is None:
        raise ValidationError("Pick a candidate first.")
    candidate = generation.candidates.filter(pk=candidate_id).first()
    if candidate is None:
        raise ValidationError("That candidate does not belong to this item's latest generation.")
    if candidate.status != Candidate.Status.DONE:
        raise ValidationError("That candidate has no answer to pick.")
    return candidate
