"""Helpdesk-style SLA: a due time from the priority, and the order tickets are worked in."""

from datetime import datetime, timedelta

from django.db.models import Case, IntegerField, QuerySet, Value, When
from django.utils import timezone

from icrlhf.queues.models import Item

# First-response targets by priority (what most helpdesks ship as their default policy).
RESPONSE_TARGETS = {
    Item.Priority.URGENT: timedelta(hours=1),
    Item.Priority.HIGH: timedelta(hours=4),
    Item.Priority.NORMAL: timedelta(hours=24),
    Item.Priority.LOW: timedelta(hours=72),
}
DUE_SOON = timedelta(hours=1)
_RANK = {
    Item.Priority.URGENT: 0,
    Item.Priority.HIGH: 1,
    Item.Priority.NORMAL: 2,
    Item.Priority.LOW: 3,
}


def sla_due(*, priority: str, received_at: datetime) -> datetime:
    return received_at + RESPONSE_TARGETS[Item.Priority(priority)]


def sla_ordered(items: QuerySet[Item]) -> QuerySet[Item]:
    """Most urgent first: priority, then due time, then longest waiting."""
    rank = Case(
        *(When(priority=priority, then=Value(value)) for priority, value in _RANK.items()),
        default=Value(9),
        output_field=IntegerField(),
    )
    return items.annotate(priority_rank=rank).order_by("priority_rank", "sla_due_at", "created_at")


def sla_state(item: Item, now: datetime | None = None) -> str:
    """ "breached", "due soon" or "" for a ticket still waiting for triage."""
    if item.sla_due_at is None or item.triaged_at is not None:
        return ""
    now = now or timezone.now()
    if item.sla_due_at <= now:
        return "breached"
    if item.sla_due_at - now <= DUE_SOON:
        return "due soon"
    return ""
