from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import transaction

from icrlhf.generation.services import generation_start
from icrlhf.queues.models import MAX_CANDIDATES, Item, Queue


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
def item_create(
    *,
    queue: Queue,
    input_text: str,
    created_by: User | None,
    n_candidates: int | None = None,
    source: str = Item.Source.UI,
    **ticket_fields: Any,
) -> Item:
    """Create an item and start its first generation (enqueued once the transaction commits).

    `ticket_fields` are Item's ticket columns (subject, body, customer, channel, priority,
    sla_due_at, external_id, category), already validated by the caller."""
    text = item_input_validate(input_text=input_text)
    count = candidate_count_validate(
        n_candidates=queue.n_candidates if n_candidates is None else n_candidates
    )
    item = Item.objects.create(
        queue=queue,
        input_text=text,
        source=source,
        created_by=created_by,
        status=Item.Status.GENERATING,
        **ticket_fields,
    )
    generation_start(item=item, n_candidates=count)
    return item
