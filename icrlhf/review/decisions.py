"""Decisions: recording one (what it teaches the memory, what it changes through the queue's
kind, the decision webhook), settling an item once its reviewers have decided, and undo."""

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from itertools import combinations
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone

from icrlhf.generation import selectors as generation_selectors
from icrlhf.generation import services as generation_services
from icrlhf.generation.models import Candidate, Generation
from icrlhf.integrations import untrusted_json
from icrlhf.kinds import Final, kind_of
from icrlhf.memory import services as memory_services
from icrlhf.memory.curation import examples_usage_record
from icrlhf.memory.services import ExampleDraft
from icrlhf.memory.signatures import action_text
from icrlhf.playbook import services as playbook_services
from icrlhf.playbook.selectors import playbook_in_force
from icrlhf.queues.locks import item_lock
from icrlhf.queues.models import Item
from icrlhf.review import automation, tasks
from icrlhf.review.claims import DecisionConflict, claim_ttl, shown_check
from icrlhf.review.judgements import (
    comment_check,
    pick_agrees_check,
    ratings_check,
    reasons_check,
)
from icrlhf.review.models import Claim, Decision
from icrlhf.review.selectors import free_slots, reviewable


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
    corrections: dict[str, str] | None = None,
    shown_candidate_ids: Sequence[int] | None = None,
    tool_calls: list[dict[str, Any]] | None = None,
    ratings: dict[int, int] | None = None,
) -> Decision:
    """Record a reviewer's verdict on the item's latest generation, with its examples.
    `ratings`: the reviewer's optional 1…5 per candidate, stored as their examples' rewards.
    `tool_calls`: the picked candidate's calls as the reviewer's editor has them (checked
    against their tools' schemas, review/tool_edits.py); an edit when they differ.

    Item and claims are read under a row lock, so of concurrent decisions only as many as the
    queue's reviewers per item win; the others get DecisionConflict and nothing is written.
    `shown_candidate_ids`, the candidates the reviewer's page showed, must be the
    generation's, each once: a page that showed something else is refused.
    """
    item = item_lock(item_id)
    now = timezone.now()
    generation = _generation_to_decide(
        item=item, reviewer=reviewer, now=now, shown_candidate_ids=shown_candidate_ids
    )
    chosen = _candidate_for(verdict=verdict, candidate_id=candidate_id, generation=generation)
    kind = kind_of(item.queue)
    answer = _answer_of(
        item=item,
        verdict=verdict,
        chosen=chosen,
        final_text=final_text,
        corrections=corrections,
        tool_calls=tool_calls,
    )
    comment_check(comment)
    reasons_check(list(reason_tags), queue=item.queue)
    ratings_check(ratings or {}, generation=generation)
    if answer.verdict == Decision.Verdict.CHOSEN and chosen is not None:
        pick_agrees_check(ratings or {}, chosen_id=chosen.pk)
    decision = _decision_create(
        item=item,
        generation=generation,
        reviewer=reviewer,
        chosen=chosen,
        answer=answer,
        reason_tags=reason_tags,
        comment=comment,
        ratings=ratings or {},
        time_to_decide_ms=time_to_decide_ms,
    )
    _memory_teach(decision)
    _memory_credit(decision)
    if answer.final is not None:
        decision.replaced = kind.on_decision(item_id=item.pk, final=answer.final)
        decision.save(update_fields=["replaced"])  # part of creating it, same transaction
    _webhook_on_commit(decision, kind.decided_event)
    automation.audit_record(decision=decision)
    Claim.objects.filter(item=item, reviewer=reviewer).update(expires_at=now)
    _item_settle(item)
    # Decided (picked, edited or none acceptable): its candidates still coming are not wanted.
    generation_services.generations_stop_if_decided(item_id=item.pk)
    return decision


def _generation_to_decide(
    *, item: Item, reviewer: User, now: datetime, shown_candidate_ids: Sequence[int] | None
) -> Generation:
    """The item's latest generation, if this reviewer may decide it now: the page showed its
    candidates, the item wants a decision, the reviewer has not decided it and holds it or a
    free slot. Else DecisionConflict, saying which."""
    generation = generation_selectors.generation_latest(item=item)
    if generation is None:
        raise DecisionConflict("This item has no candidates to decide on yet.")
    shown_check(shown_candidate_ids, generation=generation)
    if not Item.objects.filter(pk=item.pk).filter(reviewable()).exists():
        if item.status == Item.Status.DECIDED:
            raise DecisionConflict("This item has already been decided; your choice was not saved.")
        raise DecisionConflict(
            f"This item is {item.get_status_display().lower()}, so it cannot be decided now."
        )
    if item.decisions.standing().filter(reviewer=reviewer).exists():
        raise DecisionConflict("You have already decided this item; your choice was not saved.")
    holds_claim = item.claims.filter(reviewer=reviewer, expires_at__gt=now).exists()
    if not holds_claim and free_slots(item=item, reviewer=reviewer, now=now) <= 0:
        raise DecisionConflict(
            "Another reviewer is working on this item; your choice was not saved."
        )
    return generation


@dataclass(frozen=True)
class _Answer:
    """The reviewer's answer as it is stored: the verdict it amounts to (a pick whose text,
    fields or calls were changed is an edit), its text, the kind's fields and the calls."""

    verdict: str
    text: str
    fields: dict[str, str] | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    final: Final | None = None  # what the kind applies (a kind with fields; None: free text)


def _answer_of(
    *,
    item: Item,
    verdict: str,
    chosen: Candidate | None,
    final_text: str,
    corrections: dict[str, str] | None,
    tool_calls: list[dict[str, Any]] | None,
) -> _Answer:
    final = None
    if verdict != Decision.Verdict.NONE_ACCEPTABLE:
        final = kind_of(item.queue).final(
            picked_fields=chosen.fields if chosen is not None else None,
            corrections=corrections or {},
            queue=item.queue,
        )
    if final is not None:
        # A kind with fields: the picked candidate's with the reviewer's corrections; any
        # change is an edit.
        unchanged = chosen is not None and final.fields == chosen.fields
        verdict = Decision.Verdict.CHOSEN if unchanged else Decision.Verdict.EDITED
        answer = _Answer(verdict=verdict, text=final.text, fields=final.fields, final=final)
    else:
        # A pick that comes with its editor's text is an edit when the text differs.
        if verdict == Decision.Verdict.CHOSEN and final_text.strip():
            verdict = Decision.Verdict.EDITED
        verdict, final_text = _final_text(verdict=verdict, chosen=chosen, final_text=final_text)
        answer = _Answer(verdict=verdict, text=final_text)
    if (
        answer.verdict == Decision.Verdict.CHOSEN
        and chosen is not None
        and tool_calls is not None
        and _calls_differ(chosen.tool_calls, tool_calls)
    ):
        # The reviewer changed the picked candidate's calls: an edit, kept as calls.
        return replace(
            answer,
            verdict=Decision.Verdict.EDITED,
            text=action_text("", tool_calls),
            tool_calls=tool_calls,
        )
    return answer


def _decision_create(
    *,
    item: Item,
    generation: Generation,
    reviewer: User,
    chosen: Candidate | None,
    answer: _Answer,
    reason_tags: Sequence[str],
    comment: str,
    ratings: dict[int, int],
    time_to_decide_ms: int | None,
) -> Decision:
    try:
        with transaction.atomic():
            return Decision.objects.create(
                item=item,
                generation=generation,
                reviewer=reviewer,
                verdict=answer.verdict,
                chosen_candidate=chosen,
                final_text=answer.text,
                final_fields=answer.fields,
                final_tool_calls=answer.tool_calls,
                reason_tags=list(dict.fromkeys(reason_tags)),
                comment=comment.strip(),
                ratings={str(candidate): rating for candidate, rating in ratings.items()},
                # The playbook the reviewer decided beside (0: the queue had none).
                guideline_version=playbook_in_force(item.queue).number or 0,
                time_to_decide_ms=time_to_decide_ms,
                candidates_done=generation.candidates.filter(status=Candidate.Status.DONE).count(),
            )
    except IntegrityError as error:  # the same reviewer, twice at once
        raise DecisionConflict(
            "You have already decided this item; your choice was not saved."
        ) from error


def _item_settle(item: Item) -> None:
    """Decided once every reviewer the queue asks for has decided; agreement recorded."""
    standing = list(item.decisions.standing())
    complete = len(standing) >= item.queue.reviewers_per_item
    Item.objects.filter(pk=item.pk).update(
        status=Item.Status.DECIDED if complete else Item.Status.READY,
        agreement=agreement_of(standing) if len(standing) > 1 else None,
        updated_at=timezone.now(),
    )


def agreement_of(decisions: Sequence[Decision]) -> float:
    """Share of reviewer pairs that preferred the same candidate (or none)."""
    pairs = list(combinations([d.chosen_candidate_id for d in decisions], 2))
    return sum(a == b for a, b in pairs) / len(pairs)


@transaction.atomic
def decision_undo(*, decision_id: int, reviewer: User) -> Decision:
    """Take back a decision within the undo window: it is superseded (kept on record), its
    examples leave the memory, the item is open again and claimed back for the reviewer.
    The item is locked before the decision, as `decision_record` locks it (queues/locks.py)."""
    yours = Decision.objects.standing().filter(pk=decision_id, reviewer=reviewer)
    item_id = yours.values_list("item_id", flat=True).first()
    item = item_lock(item_id) if item_id is not None else None
    # Read again under the lock: another request may have undone it meanwhile.
    decision = yours.select_for_update().first() if item is not None else None
    if item is None or decision is None:
        raise DecisionConflict("There is no decision of yours to undo.")
    now = timezone.now()
    if now - decision.created_at > timedelta(seconds=settings.REVIEW_UNDO_WINDOW_S):
        raise DecisionConflict("The undo window has passed; the decision stands.")
    decision.superseded_at = now
    decision.save(update_fields=["superseded_at"])
    memory_services.examples_withdraw(decision_id=decision.pk, actor=reviewer)
    _memory_credit(decision, undo=True)
    if decision.replaced is not None:
        _kind_undo(item, replaced=decision.replaced)
    _webhook_on_commit(decision, kind_of(item.queue).undone_event)
    automation.audit_withdraw(decision=decision)
    _item_settle(item)
    Claim.objects.update_or_create(
        item=item, reviewer=reviewer, defaults={"expires_at": now + claim_ttl(), "skipped": False}
    )
    return decision


def _memory_teach(decision: Decision) -> None:
    """What a decision teaches the memory: its final answer is preferred (unless none was
    acceptable); every other finished candidate is rejected, including one an edit started
    from. Each candidate is remembered in its kind's form (a triage as its fields), with its
    rating as its reward where the reviewer gave one. For an agent's step captured from the
    gateway, a reviewer's edit of its tool call is thus the step's preferred action and the
    served call its rejected rival, as an application's correction is (unlike a correction,
    it leaves what the step's reward stored before as it is: a curator retires that)."""
    rewards = {
        int(candidate): memory_services.rating_reward(rating)
        for candidate, rating in decision.ratings.items()
    }
    preferred = None
    if decision.verdict != Decision.Verdict.NONE_ACCEPTABLE:
        chosen = decision.chosen_candidate
        preferred = ExampleDraft(
            candidate_id=decision.chosen_candidate_id,
            output_text=decision.final_text,
            # A pick's rating is its reward; an edit is the reviewer's own answer (1.0).
            reward=rewards.get(chosen.pk)
            if chosen is not None and decision.verdict == Decision.Verdict.CHOSEN
            else None,
        )
        if chosen is not None and chosen.tool_calls and decision.verdict == Decision.Verdict.CHOSEN:
            preferred = replace(preferred, output_text=chosen.text, tool_calls=chosen.tool_calls)
        elif decision.final_tool_calls:  # the reviewer's own calls, edited as fields
            preferred = replace(preferred, output_text="", tool_calls=decision.final_tool_calls)
        # (A text edit of a tool call is the reviewer's own answer in words: no calls.)
    kind = kind_of(decision.item.queue)
    rejected = decision.generation.candidates.filter(status=Candidate.Status.DONE)
    if decision.verdict == Decision.Verdict.CHOSEN and decision.chosen_candidate_id is not None:
        rejected = rejected.exclude(pk=decision.chosen_candidate_id)
    memory_services.examples_record(
        decision_id=decision.pk,
        queue_id=decision.item.queue_id,
        input_text=decision.item.input_text,
        preferred=preferred,
        rejected=[
            ExampleDraft(
                candidate_id=candidate.pk,
                output_text=kind.example_text(text=candidate.text, fields=candidate.fields),
                tool_calls=candidate.tool_calls,
                # Unrated, an answer the application was served keeps the reward it gave it
                # (a step rewarded below the bar), as its correction through feedback would.
                reward=rewards.get(candidate.pk, candidate.reward),
            )
            for candidate in rejected
        ]
        + _tried_again(decision),
        conversation=decision.item.conversation,
        call_options=decision.item.call_options,
    )


def _tried_again(decision: Decision) -> list[ExampleDraft]:
    """The answers of the item's earlier rounds that a reviewer sent back with "try again":
    rejected, each once, with the reward they were given; none that the decided round holds
    or the decision kept (those are stored as the round's)."""
    kind = kind_of(decision.item.queue)

    def action(candidate: Candidate) -> str:
        text = kind.example_text(text=candidate.text, fields=candidate.fields)
        return action_text(text, candidate.tool_calls).strip()

    decided_round = {
        action(candidate)
        for candidate in decision.generation.candidates.filter(status=Candidate.Status.DONE)
    } | {decision.final_text.strip()}
    return [
        ExampleDraft(
            candidate_id=sent.candidate.pk,
            output_text=kind.example_text(text=sent.candidate.text, fields=sent.candidate.fields),
            tool_calls=sent.candidate.tool_calls,
            reward=sent.reward,
        )
        for sent in generation_selectors.answers_sent_back(
            item=decision.item, before=decision.generation
        )
        if action(sent.candidate) not in decided_round
    ]


def _memory_credit(decision: Decision, *, undo: bool = False) -> None:
    """The examples the decided generation was prompted with helped if a candidate was taken
    as it was; the playbook entries it carried, if that candidate was the ranking's first."""
    examples_usage_record(
        generation_id=decision.generation_id,
        generated_at=decision.generation.created_at,
        accepted=decision.verdict == Decision.Verdict.CHOSEN,
        undo=undo,
    )
    chosen = decision.chosen_candidate
    playbook_services.outcome_record(
        version_id=decision.generation.playbook_id,
        first_chosen=decision.verdict == Decision.Verdict.CHOSEN
        and chosen is not None
        and chosen.rank in (1, None),  # as DecisionQuerySet.first_taken
        undo=undo,
    )


def _final_text(*, verdict: str, chosen: Candidate | None, final_text: str) -> tuple[str, str]:
    if verdict == Decision.Verdict.NONE_ACCEPTABLE:
        return verdict, ""
    assert chosen is not None
    if verdict == Decision.Verdict.EDITED:
        final_text = final_text.strip()
        if not final_text:
            raise ValidationError("The edited answer is empty. Write the answer, or pick one.")
        if len(final_text) > settings.ITEM_INPUT_MAX_CHARS:
            raise ValidationError(
                f"The edited answer is longer than {settings.ITEM_INPUT_MAX_CHARS:,} characters."
            )
        if final_text != chosen.text.strip():
            return verdict, final_text
    # An unchanged edit is a pick; a picked tool call is kept as its text too (exports).
    return Decision.Verdict.CHOSEN, action_text(chosen.text, chosen.tool_calls)


def _calls_differ(original: list[dict[str, Any]], edited: list[dict[str, Any]]) -> bool:
    """Whether the edited calls name other tools or other arguments (as values: the same
    JSON written with other spacing is the same call)."""

    def meaning(calls: list[dict[str, Any]]) -> list[tuple[Any, Any]]:
        out = []
        for call in calls:
            function = call.get("function") or {}
            try:
                arguments = untrusted_json.loads(function.get("arguments") or "{}")
            except untrusted_json.NotJson:
                arguments = function.get("arguments")
            out.append((function.get("name"), arguments))
        return out

    return meaning(original) != meaning(edited)


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


def _kind_undo(item: Item, *, replaced: dict[str, Any]) -> None:
    """Put back what an undone decision changed through its kind (`replaced`), unless another
    reviewer's standing decision on the item should show instead (then theirs is applied
    again)."""
    kind = kind_of(item.queue)
    other = (
        item.decisions.standing().exclude(final_fields__isnull=True).order_by("-created_at").first()
    )
    if other is not None and other.final_fields is not None:
        kind.on_decision(item_id=item.pk, final=Final(other.final_fields, other.final_text))
    else:
        kind.on_undo(item_id=item.pk, replaced=replaced)


def _webhook_on_commit(decision: Decision, event: str) -> None:
    automation.webhook_on_commit(
        queue=decision.item.queue,
        final_fields=decision.final_fields,
        send=lambda: tasks.decision_webhook.delay(decision.pk, event),
    )
