"""The triage queue's forms: a ticket typed in by hand, and the ticket list's filters."""

from typing import Any

from django import forms

from icrlhf.queues.models import Item, Queue
from icrlhf.queues.services import item_input_validate


class TicketFilterForm(forms.Form):
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
    channel = forms.CharField(required=False, max_length=50)

    def __init__(self, *args: Any, queue: Queue, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        categories = [(c, c) for c in queue.categories]
        category = self.fields["category"]
        assert isinstance(category, forms.ChoiceField)
        category.choices = [("", "Any category"), *categories]

    def chosen(self) -> dict[str, str]:
        """The filters picked, or none when the form is empty or invalid."""
        return self.cleaned_data if self.is_bound and self.is_valid() else {}


class TicketCreateForm(forms.Form):
    """A ticket typed in by hand (most arrive through the API or an import)."""

    subject = forms.CharField(max_length=500)
    body = forms.CharField(widget=forms.Textarea(attrs={"rows": 5}))
    customer = forms.CharField(max_length=200, required=False)
    channel = forms.CharField(max_length=50, required=False, initial="web")
    priority = forms.ChoiceField(choices=Item.Priority.choices, initial=Item.Priority.NORMAL)

    def clean_body(self) -> str:
        return item_input_validate(input_text=self.cleaned_data["body"])
