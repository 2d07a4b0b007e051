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
        # Cut off at the token limit before its closing brace: still read, line by line.
        '{\n  "category": "card_arrival",\n  "priority": "high",\n  "reply": "It is on its way.',
        # The same on one line, as a grammar writes it: closed where it was cut.
        '{"category": "card_arrival", "priority": "high", "reply": "It is on its way.',
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


def test_the_schema_holds_the_queues_categories_and_the_priorities_as_enums(db: None) -> None:
    from icrlhf.kinds import kind_of
    from icrlhf.kinds.triage.fields import PRIORITIES, triage_schema
    from tests.factories import QueueFactory

    queue = QueueFactory(kind="triage", categories=CATEGORIES, max_tokens=100)
    schema = triage_schema(queue)
    assert schema["properties"]["category"]["enum"] == CATEGORIES  # type: ignore[index]
    assert schema["properties"]["priority"]["enum"] == list(PRIORITIES)  # type: ignore[index]
    assert schema["properties"]["reply"]["maxLength"] == 100  # type: ignore[index]  # fits 100 tokens
    assert schema["required"] == ["category", "priority", "reply"]
    asked = kind_of(queue).response_format(queue)
    assert asked is not None and asked["type"] == "json_schema"
    assert asked["json_schema"]["schema"] == schema
    assert kind_of(QueueFactory()).response_format(QueueFactory()) is None  # free text


def test_a_line_of_fifty_thousand_spaces_is_read_in_linear_time() -> None:
    """The key-value reader's pattern has no two adjacent open-ended runs (the old one took
    seconds on 10,000 spaces); a model's or an attacker's whitespace costs nothing."""
    from icrlhf.kinds.triage.fields import _KEY_VALUE, _key_value_lines

    assert _key_value_lines(" " * 50_000 + "x") == {}
    assert _key_value_lines("  - **Category** : card_arrival") == {"category": "card_arrival"}
    assert r"\s*[*#>\-]*\s*" not in _KEY_VALUE.pattern


def test_a_deeply_nested_answer_is_an_invalid_triage_not_a_crash() -> None:
    with pytest.raises(TriageParseError):
        triage_parse("[" * 100_000 + "]" * 100_000, CATEGORIES)
