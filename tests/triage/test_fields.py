import pytest
from hypothesis import given
from hypothesis import strategies as st

from icrlhf.kinds.triage.fields import TriageFields, TriageParseError, triage_parse

CATEGORIES = ["card_arrival", "lost_or_stolen_card", "exchange_rate", "pin_blocked"]


@pytest.mark.parametrize(
    "answer",
    [
        '{"category": "card_arrival", "priority": "high", "reply": "It is on its way."}',
        'Sure!\n```json\n{"category": "card_arrival", "priority": "high", '
        '"reply": "It is on its way."}\n```\nAnything else?',
        "{'category': 'Card Arrival', 'priority': 'HIGH', 'reply': 'It is on its way.',}",
        "Category: card arrival\nPriority: high\nReply: It is on its way.",
        "**Category**: card-arrival\n**Priority**: high\n**Response**: It is on its way.",
        '{"Category": "card_arival", "Priority": "high", "Reply": "It is on its way."}',
    ],
)
def test_the_models_formatting_is_tolerated(answer: str) -> None:
    assert triage_parse(answer, CATEGORIES) == TriageFields(
        "card_arrival", "high", "It is on its way."
    )


def test_priority_synonyms_and_defaults() -> None:
    assert triage_parse('{"category": "pin_blocked", "priority": "medium"}', CATEGORIES) == (
        TriageFields("pin_blocked", "normal", "")
    )
    assert triage_parse('{"category": "pin_blocked"}', CATEGORIES).priority == "normal"
    assert triage_parse("Category: pin_blocked\nPriority: critical", CATEGORIES).priority == (
        "urgent"
    )


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        ('{"category": "mortgage", "priority": "high"}', "“mortgage” is not one of the queue's"),
        ('{"priority": "high", "reply": "hi"}', "The answer names no category."),
        ("I am happy to help you with your card!", "The answer names no category."),
        ('{"category": "card_arrival", "priority": "soonish"}', "“soonish” is not a priority"),
        ("", "The answer names no category."),
    ],
)
def test_an_answer_that_does_not_fit_is_refused_with_the_reason(answer: str, message: str) -> None:
    with pytest.raises(TriageParseError, match=message):
        triage_parse(answer, CATEGORIES)


@given(st.text(max_size=400))
def test_no_answer_whatever_its_text_breaks_the_parser(answer: str) -> None:
    try:
        fields = triage_parse(answer, CATEGORIES)
    except TriageParseError:
        return
    assert fields.category in CATEGORIES
    assert fields.priority in {"low", "normal", "high", "urgent"}
