from django import forms
from django.conf import settings

from icrlhf.queues.models import MAX_CANDIDATES
from icrlhf.queues.services import candidate_count_validate, item_input_validate


class ItemCreateForm(forms.Form):
    input_text = forms.CharField(
        label="Prompt or ticket",
        strip=False,
        widget=forms.Textarea(attrs={"rows": 5, "maxlength": settings.ITEM_INPUT_MAX_CHARS}),
        error_messages={"required": "The input is empty: type the prompt or ticket to answer."},
    )
    n_candidates = forms.IntegerField(
        label="Candidates",
        required=False,
        help_text=f"1–{MAX_CANDIDATES}; empty uses the queue's setting.",
        widget=forms.NumberInput(attrs={"min": 1, "max": MAX_CANDIDATES}),
    )

    def clean_input_text(self) -> str:
        return item_input_validate(input_text=self.cleaned_data["input_text"])

    def clean_n_candidates(self) -> int | None:
        value = self.cleaned_data["n_candidates"]
        return None if value is None else candidate_count_validate(n_candidates=value)
