from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction

from icrlhf.queues.models import MAX_CANDIDATES, Queue


def item_input_validate(*, input_text: str) -> str:
    text = input_text.strip()
    if not text:
        raise ValidationError("The input is empty: type the prompt or ticket to answer.")
    if len(text) > settings.ITEM_INPUT_MAX_CHARS:
        raise ValidationError(
            f"The input has {len(text):,} characters; the limit is "
            f"{settings.ITEM_INPUT_MAX_CHARS:,}. Shorten it and try again."
        )
    return text


def candidate_count_validate(*, n_candidates: int) -> int:
    if not 1 <= n_candidates <= MAX_CANDIDATES:
        raise ValidationError(
            f"The number of candidates must be between 1 and {MAX_CANDIDATES}, not {n_candidates}."
        )
    return n_candidates


@transaction.atomic
def queue_save(*, queue: Queue) -> Queue:
    """Save a queue's settings. Decisions record the guideline version they were made under,
    so an edit of the guidelines is a new version."""
    if queue.pk is not None:
        stored = (
            Queue.objects.select_for_update()
            .filter(pk=queue.pk)
            .values_list("guidelines", "guidelines_version")
            .first()
        )
        if stored is not None and stored[0] != queue.guidelines:
            queue.guidelines_version = stored[1] + 1
    queue.save()
    return queue
