import logging
from datetime import datetime
from typing import Any

from django.core.exceptions import ValidationError
from django.utils import timezone

from icrlhf.generation.services import item_create_once, item_existing
from icrlhf.kinds import kind_of
from icrlhf.kinds.triage.fields import TriageParseError, fields_validate
from icrlhf.kinds.triage.sla import sla_due
from icrlhf.queues.models import Item, Queue

logger = logging.getLogger(__name__)


def ticket_input_text(*, subject: str, body: str) -> str:
    """What the model reads and retrieval searches: subject and body together."""
    return f"{subject.strip()}\n\n{body.strip()}".strip()


def ticket_create(
    *,
    queue: Queue,
    subject: str,
    body: str,
    source: str,
    customer: str = "",
    channel: str = "",
    priority: str = Item.Priority.NORMAL,
    sla_due_at: datetime | None = None,
    external_id: str = "",
    category: str = "",
    metadata: dict[str, Any] | None = None,
) -> tuple[Item, bool]:
    """Create a ticket and start its triage; idempotent on external id.

    Returns the ticket and whether it was created (False: one with this external id exists).
    """
    if not kind_of(queue).takes_tickets:
        raise ValidationError(
            f"“{queue.name}” is not a triage queue: tickets go to triage queues only."
        )
    if external_id and (existing := item_existing(queue=queue, external_id=external_id)):
        return existing, False  # before validating: the first request's answer stands
    if category:
        try:
            category = fields_validate(
                category=category, priority=priority, reply="", categories=queue.categories
            ).category
        except TriageParseError as error:
            raise ValidationError(str(error)) from error
    received_at = timezone.now()
    return item_create_once(
        queue=queue,
        external_id=external_id,
        input_text=ticket_input_text(subject=subject, body=body),
        created_by=None,
        source=source,
        subject=subject.strip(),
        body=body.strip(),
        customer=customer.strip(),
        channel=channel.strip(),
        priority=priority,
        sla_due_at=sla_due_at or sla_due(priority=priority, received_at=received_at),
        category=category,
        metadata=metadata or {},
    )


_SUBJECT_MAX = Item._meta.get_field("subject").max_length or 500


def ticket_create_from_text(
    *,
    queue: Queue,
    text: str,
    source: str,
    external_id: str = "",
    metadata: dict[str, Any] | None = None,
) -> tuple[Item, bool]:
    """A ticket from one text, as the items API takes any queue's input: its first line the
    subject (cut at 500 characters, the whole text then kept as the body) and the rest the
    body."""
    first, _, rest = text.strip().partition("\n")
    subject = first.strip()
    if len(subject) > _SUBJECT_MAX:
        subject, rest = subject[: _SUBJECT_MAX - 1] + "…", text
    return ticket_create(
        queue=queue,
        source=source,
        subject=subject,
        body=rest.strip(),
        external_id=external_id,
        metadata=metadata,
    )
