from django import forms

from icrlhf.review.models import Decision


class DecisionForm(forms.Form):
    verdict = forms.ChoiceField(choices=Decision.Verdict.choices)
    candidate = forms.IntegerField(required=False)
    final_text = forms.CharField(required=False, strip=False)
    comment = forms.CharField(required=False, max_length=5000)
    shown_at_ms = forms.IntegerField(required=False, min_value=0)
