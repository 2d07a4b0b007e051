import logging
from datetime import datetime
from typing import Any

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone

from icrlhf.generation.models import Candidate
from icrlhf.integrations import webhooks
from icrlhf.queues.models import Item, Queue
from icrlhf.queues.services import item_create
from icrlhf.review.models import Decision
from icrlhf.triage import tasks
from icrlhf.triage.fields import TriageFields, TriageParseError, fields_validate
from icrlhf.triage.sla import sla_due

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
) -> tuple[Item, bool]:
    """Create a ticket and start its triage; idempotent on external id.

    Returns the ticket and whether it was created (False: one with this external id exists).
    """
    if queue.kind != Queue.Kind.TRIAGE:
        raise ValidationError(
            f"“{queue.name}” is not a triage queue: tickets go to triage queues only."
        )
    if external_id:
        existing = Item.objects.filter(queue=queue, external_id=external_id).first()
        if existing is not None:
            return existing, False
    if category:
        try:
            category = fields_validate(
                category=category, priority=priority, reply="", categories=queue.categories
            ).category
        except TriageParseError as error:
            raise ValidationError(str(error)) from error
    received_at = timezone.now()
    try:
        with transaction.atomic():
            item = item_create(
                queue=queue,
                input_text=ticket_input_text(subject=subject, body=body),
                created_by=None,
                source=source,
                subject=subject.strip(),
                body=body.strip(),
                customer=customer.strip(),
                channel=channel.strip(),
                priority=priority,
                sla_due_at=sla_due_at or sla_due(priority=priority, received_at=received_at),
                external_id=external_id,
                category=category,
            )
    except IntegrityError:
        # The same external id, sent twice at the same moment: the other request won.
        return Item.objects.get(queue=queue, external_id=external_id), False
    return item, True


def triage_final(
    *, chosen: Candidate | None, corrections: dict[str, str], categories: list[str]
) -> TriageFields:
    """The confirmed fields: the chosen candidate's, with the reviewer's corrections on top."""
    base: dict[str, Any] = dict(chosen.fields or {}) if chosen is not None else {}
    merged = {
        key: corrections.get(key) or base.get(key) or ""
        for key in ("category", "priority", "reply")
    }
    try:
        return fields_validate(
            category=str(merged["category"]),
            priority=str(merged["priority"] or "normal"),
            reply=str(merged["reply"]),
            categories=categories,
        )
    except TriageParseError as error:
        raise ValidationError(f"The triage is incomplete: {error}") from error


def triage_apply(*, decision: Decision) -> None:
    """Write the confirmed triage back to the ticket, and tell the helpdesk (after commit)."""
    fields = decision.final_fields or {}
    Item.objects.filter(pk=decision.item_id).update(
        category=fields.get("category", ""),
        priority=fields.get("priority", Item.Priority.NORMAL),
        ticket_status=Item.TicketStatus.OPEN,
        triaged_at=timezone.now(),
    )
    if decision.item.queue.webhook_url:
        transaction.on_commit(lambda: tasks.ticket_webhook.delay(decision.pk), robust=True)


def ticket_webhook_send(*, decision_id: int) -> None:
    decision = Decision.objects.select_related("item__queue", "reviewer").get(pk=decision_id)
    item, queue = decision.item, decision.item.queue
    if not queue.webhook_url or decision.superseded_at is not None:
        return
    payload = {
        "event": "ticket.triaged",
        "ticket": {
            "id": item.pk,
            "external_id": item.external_id,
            "subject": item.subject,
            "status": item.ticket_status,
        },
        "triage": decision.final_fields,
        "verdict": decision.verdict,
        "decided_by": decision.reviewer.get_username(),
        "decided_at": decision.created_at.isoformat(),
        "queue": queue.slug,
    }
    webhooks.post_signed(
        url=queue.webhook_url, secret=queue.webhook_secret, event="ticket.triaged", payload=payload
    )
