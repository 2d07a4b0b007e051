"""The triage queue's ticket list: SLA order, badges, filters."""

from collections.abc import Mapping
from dataclasses import dataclass

from django.utils import timezone

from icrlhf.kinds.triage.sla import sla_ordered, sla_state
from icrlhf.queues.models import Item, Queue

_LIST_LIMIT = 200


@dataclass(frozen=True)
class TicketRow:
    item: Item
    sla: str


def tickets_for_queue(*, queue: Queue, filters: Mapping[str, str]) -> list[TicketRow]:
    """The queue's tickets, most urgent first; `filters` as TicketFilterForm.chosen()."""
    items = queue.items.all()
    review = filters.get("review", "")
    if review == "":
        items = items.exclude(status__in=[Item.Status.DECIDED, Item.Status.AUTOMATED])
    elif review in {"decided", "automated"}:
        items = items.filter(status=review)
    if filters.get("status"):
        items = items.filter(ticket_status=filters["status"])
    if filters.get("category"):
        items = items.filter(category=filters["category"])
    if filters.get("priority"):
        items = items.filter(priority=filters["priority"])
    if filters.get("channel"):
        items = items.filter(channel__iexact=filters["channel"].strip())
    now = timezone.now()
    return [TicketRow(item, sla_state(item, now)) for item in sla_ordered(items)[:_LIST_LIMIT]]
