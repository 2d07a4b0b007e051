"""The triage queue's ticket list: SLA order, badges, filters."""

from collections.abc import Mapping
from dataclasses import dataclass

from django.db.models import Q
from django.db.models.functions import Lower
from django.utils import timezone

from icrlhf.kinds.triage.sla import sla_ordered, sla_state
from icrlhf.queues.models import Item, Queue

_LIST_LIMIT = 200
_SEARCH_WORDS = 10


@dataclass(frozen=True)
class TicketRow:
    item: Item
    sla: str


def tickets_channels(*, queue: Queue) -> list[str]:
    """The channels the queue's tickets came through, lower-cased (the filter ignores case)."""
    channels = (
        queue.items.exclude(channel="")
        .annotate(lowered=Lower("channel"))
        .order_by("lowered")
        .values_list("lowered", flat=True)
        .distinct()
    )
    return list(channels)


def _search(text: str) -> Q:
    """Every word must appear in the subject, the body, the customer or the external id; a
    number (with or without #) also finds the ticket of that id."""
    query = Q()
    for word in text.split()[:_SEARCH_WORDS]:
        matches = (
            Q(subject__icontains=word)
            | Q(body__icontains=word)
            | Q(customer__icontains=word)
            | Q(external_id__iexact=word)
        )
        if (number := word.removeprefix("#")).isdigit() and len(number) < 12:
            matches |= Q(pk=int(number))
        query &= matches
    return query


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
    if filters.get("search"):
        items = items.filter(_search(filters["search"]))
    now = timezone.now()
    return [TicketRow(item, sla_state(item, now)) for item in sla_ordered(items)[:_LIST_LIMIT]]
