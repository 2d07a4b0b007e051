"""The triage queue's ticket list: SLA order, badges, filters."""

from dataclasses import dataclass
from typing import Any

from django import forms
from django.utils import timezone

from icrlhf.queues.models import Item, Queue
from icrlhf.queues.services import item_input_validate
from icrlhf.triage.sla import sla_ordered, sla_state

_LIST_LIMIT = 200


class TicketFilterForm(forms.Form):
    status = forms.ChoiceField(
        required=False, choices=[("", "Any status"), *Item.TicketStatus.choices]
    )
    category = forms.ChoiceField(required=False)
    priority = forms.ChoiceField(
        required=False, choices=[("", "Any priority"), *Item.Priority.choices]
    )
    channel = forms.CharField(required=False, max_length=50)

    def __init__(self, *args: Any, queue: Queue, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        categories = [(c, c) for c in queue.categories]
        self.fields["category"].choices = [("", "Any category"), *categories]  # type: ignore[attr-defined]


@dataclass(frozen=True)
class TicketRow:
    item: Item
    sla: str


def tickets_for_queue(*, queue: Queue, filters: TicketFilterForm) -> list[TicketRow]:
    items = queue.items.all()
    if filters.is_bound and filters.is_valid():
        data = filters.cleaned_data
        if data["status"]:
            items = items.filter(ticket_status=data["status"])
        if data["category"]:
            items = items.filter(category=data["category"])
        if data["priority"]:
            items = items.filter(priority=data["priority"])
        if data["channel"]:
            items = items.filter(channel__iexact=data["channel"].strip())
    now = timezone.now()
    return [TicketRow(item, sla_state(item, now)) for item in sla_ordered(items)[:_LIST_LIMIT]]


class TicketCreateForm(forms.Form):
    """A ticket typed in by hand (most arrive through the API or an import)."""

    subject = forms.CharField(max_length=500)
    body = forms.CharField(widget=forms.Textarea(attrs={"rows": 5}))
    customer = forms.CharField(max_length=200, required=False)
    channel = forms.CharField(max_length=50, required=False, initial="web")
    priority = forms.ChoiceField(choices=Item.Priority.choices, initial=Item.Priority.NORMAL)

    def clean_body(self) -> str:
        return item_input_validate(input_text=self.cleaned_data["body"])
