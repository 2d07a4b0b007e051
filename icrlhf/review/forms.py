from typing import Any

from django import forms

from icrlhf.review.services import MAX_COMMENT_CHARS


class DecisionForm(forms.Form):
    """`choice` is "c<candidate id>" or "none"; an edited text comes as final_text_<id>, the
    reason tags as a list (the service checks them against the queue's)."""

    choice = forms.RegexField(regex=r"^(c\d+|none)$")
    comment = forms.CharField(required=False, max_length=MAX_COMMENT_CHARS)
    shown_at_ms = forms.IntegerField(required=False, min_value=0)

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        choice = data.get("choice")
        if choice:
            data["verdict"] = "none_acceptable" if choice == "none" else "chosen"
            data["candidate_id"] = None if choice == "none" else int(choice[1:])
        return data
