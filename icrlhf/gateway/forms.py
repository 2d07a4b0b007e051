from typing import Any

from django import forms

from icrlhf.queues.models import Queue
from icrlhf.queues.rules import Evidence, rule_refusals
from icrlhf.queues.services import (
    AUTOMATION_FIELDS,
    GATEWAY_FIELDS,
    REWARD_FIELDS,
    ROUTING_FIELDS,
)


class RoutingForm(forms.ModelForm[Queue]):
    """A queue's routing rules for gateway calls (the model's validators bound each one). A
    rule that would do nothing given the queue's `evidence` (automation with no confidence
    fitted, …) is refused with the sentence that says why."""

    class Meta:
        model = Queue
        fields = ROUTING_FIELDS
        widgets = {
            "capture_below_similarity": forms.NumberInput(attrs={"step": "0.01"}),
            "memory_answer_threshold": forms.NumberInput(attrs={"step": "0.01"}),
            "memory_answer_confidence": forms.NumberInput(attrs={"step": "any"}),
            "auto_apply_threshold": forms.NumberInput(attrs={"step": "any"}),
            "reward_threshold": forms.NumberInput(attrs={"step": "any"}),
        }

    def __init__(self, *args: Any, evidence: Evidence, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.evidence = evidence

    def clean(self) -> dict[str, Any]:
        super().clean()
        refused = rule_refusals(values=self.cleaned_data, evidence=self.evidence)
        # A rule is refused as it is set (or its bar cleared), not for being on already: a
        # curator changing something else is not made to clear it first.
        changed = set(self.changed_data)
        if "reward_threshold" in changed:
            changed.add("capture_low_reward")
        for name, sentence in refused.items():
            if name in changed:
                self.add_error(name, sentence)
        return self.cleaned_data

    def gateway_fields(self) -> list[forms.BoundField]:
        return [self[name] for name in GATEWAY_FIELDS]

    def automation_fields(self) -> list[forms.BoundField]:
        return [self[name] for name in AUTOMATION_FIELDS]

    def reward_fields(self) -> list[forms.BoundField]:
        return [self[name] for name in REWARD_FIELDS]
