"""The decision form reads what the queue's kind asks reviewers to correct, and nothing else."""

from django.http import QueryDict

from icrlhf.kinds.base import QueueKind
from icrlhf.kinds.triage import TriageKind
from icrlhf.review.forms import DecisionForm


def _posted(**fields: str) -> QueryDict:
    data = QueryDict(mutable=True)
    data.update({"choice": "c7", **fields})
    return data


def test_a_triage_decision_reads_its_corrections_by_the_kinds_field_names() -> None:
    form = DecisionForm(
        _posted(correction_category=" billing ", correction_priority="high", correction_reply=""),
        correction_fields=TriageKind.correction_fields,
    )
    assert form.is_valid(), form.errors
    assert form.decision_input().corrections == {
        "category": "billing",
        "priority": "high",
        "reply": "",
    }


def test_a_kind_without_corrections_ignores_posted_ones() -> None:
    form = DecisionForm(
        _posted(correction_category="billing"), correction_fields=QueueKind.correction_fields
    )
    assert form.is_valid(), form.errors
    assert form.decision_input().corrections == {}
