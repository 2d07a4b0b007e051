from django import forms

from icrlhf.playbook.models import ENTRY_MAX_CHARS, SECTION_MAX_CHARS


class EntryForm(forms.Form):
    section = forms.CharField(
        max_length=SECTION_MAX_CHARS,
        help_text="Where the rule belongs (Tone, Refunds, Cards…): rules are grouped by it.",
    )
    text = forms.CharField(
        label="Rule",
        max_length=ENTRY_MAX_CHARS,
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text=f"One rule, in plain words (at most {ENTRY_MAX_CHARS} characters): it goes "
        "into every prompt of the queue.",
    )


class ImportForm(forms.Form):
    file = forms.FileField(help_text="A playbook exported from this queue or another (JSON).")
