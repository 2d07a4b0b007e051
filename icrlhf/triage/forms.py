"""The triage queue's forms: a ticket typed in by hand, and the ticket list's filters."""

from collections.abc import Sequence
from typing import Any

from django import forms

from icrlhf.queues.models import Item, Queue
from icrlhf.queues.services import item_input_validate


class TicketFilterForm(forms.Form):
    search = forms.CharField(
        required=False,
        max_length=200,
        widget=forms.TextInput(attrs={"type": "search", "placeholder": "Words, customer, #id"}),
    )
    # The list's default is what still needs a reviewer; decided tickets on request.
    review = forms.ChoiceField(
        required=False,
        choices=[
            ("", "Waiting for review"),
            ("decided", "Decided"),
            ("automated", "Triaged automatically"),
            ("all", "All tickets"),
        ],
    )
    status = forms.ChoiceField(
        required=False, choices=[("", "Any status"), *Item.TicketStatus.choices]
    )
    category = forms.ChoiceField(required=False)
    priority = forms.ChoiceField(
        required=False, choices=[("", "Any priority"), *Item.Priority.choices]
    )
    channel = forms.ChoiceField(required=False)

    def __init__(
        self, *args: Any, queue: Queue, channels: Sequence[str] = (), **kwargs: Any
    ) -> None:
        """`channels`: those the queue's tickets came through (tickets_channels)."""
        super().__init__(*args, **kwargs)
        for name, empty, values in [
            ("category", "Any category", queue.categories),
            ("channel", "Any channel", channels),
        ]:
            field = self.fields[name]
            assert isinstance(field, forms.ChoiceField)
            field.choices = [("", empty), *((value, value) for value in values)]

    def chosen(self) -> dict[str, str]:
        """The filters picked; one that is not valid (a channel no ticket has any more, in an
        old link) is left out and shows its error, the others still apply."""
        if not self.is_bound:
            return {}
        self.is_valid()
        return dict(self.cleaned_data)


class TicketCreateForm(forms.Form):
    """A ticket typed in by hand (most arrive through the API or an import)."""

    subject = forms.CharField(max_length=500)
    body = forms.CharField(widget=forms.Textarea(attrs={"rows": 5}))
    customer = forms.CharField(max_length=200, required=False)
    channel = forms.CharField(max_length=50, required=False, initial="web")
    priority = forms.ChoiceField(choices=Item.Priority.choices, initial=Item.Priority.NORMAL)

    def clean_body(self) -> str:
        return item_input_validate(input_text=self.cleaned_data["body"])
