"""Redaction: each kind found and confirmed by its library, placeholders in its place, and
look-alikes (numbers failing their checksum, broken addresses) left alone."""

import json
from typing import Any

import pytest

from icrlhf.integrations.redaction import CARD, EMAIL, IBAN, PHONE, redact, redact_json
from icrlhf.integrations.text_checks import unstorable_text


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Write to ana.b+tag@mail.example.org.", f"Write to {EMAIL}."),
        ("<jo@example.com>", f"<{EMAIL}>"),
        ("Call (415) 555-2671 today", f"Call {PHONE} today"),
        ("Call +44 20 7946 0958", f"Call {PHONE}"),
        ("Card 4111-1111-1111-1111 declined", f"Card {CARD} declined"),
        ("IBAN GB82 WEST 1234 5698 7654 32", f"IBAN {IBAN}"),
        # The IBAN followed by words: found, the words kept (the candidate ran on into them).
        (
            "from GB82WEST12345698765432 to other bank accounts",
            f"from {IBAN} to other bank accounts",
        ),
        ("IBAN GB82 WEST 1234 5698 7654 32 to you", f"IBAN {IBAN} to you"),
    ],
)
def test_personal_data_becomes_a_placeholder(text: str, expected: str) -> None:
    assert redact(text).text == expected


@pytest.mark.parametrize(
    "text",
    [
        "Order 4111 1111 1111 1112 shipped",  # fails the Luhn check
        "IBAN GB00 WEST 1234 5698 7654 32",  # fails the IBAN check
        "user@@example.com and a@b",  # not addresses
        "Version 2.4.0 of 2026-11-25, 3 items",  # numbers, not phones
        "at 2026-11-29 10:00 and 2026-11-29 10:00:00",  # times, not phones
    ],
)
def test_look_alikes_are_left_alone(text: str) -> None:
    assert redact(text).text == text


def test_it_counts_what_it_replaced() -> None:
    redacted = redact("a@example.com b@example.com 4111111111111111")
    assert redacted.counts == {EMAIL: 2, CARD: 1}


def test_json_stays_json_numbers_included_and_ids_stay_ids() -> None:
    arguments = json.dumps({"card": 4111111111111111, "note": "mail ana@example.com", "n": 3})
    call = {
        "id": "call_4155552671",
        "type": "function",
        "function": {"name": "refund", "arguments": arguments},
    }
    [redacted] = redact_json([call])
    assert redacted["id"] == "call_4155552671"  # an id, not a phone number
    assert json.loads(redacted["function"]["arguments"]) == {
        "card": CARD,
        "note": f"mail {EMAIL}",
        "n": 3,
    }
    untouched = '{"order_id":"4821",  "amount":20}'
    assert redact_json(untouched) == untouched  # nothing personal: byte for byte
    assert redact_json("{not json ana@example.com") == f"{{not json {EMAIL}"


def test_an_escaped_lone_surrogate_stays_an_escape_that_both_databases_store() -> None:
    # The escape, not the character: what a request that passed text_checks can hold.
    arguments = '{"a": "\\ud800 ana@example.com", "b": "café"}'
    assert unstorable_text(arguments) is None

    redacted = redact_json(arguments)

    assert unstorable_text(redacted) is None
    assert "ana@example.com" not in redacted
    assert json.loads(redacted) == {"a": f"\ud800 {EMAIL}", "b": "café"}


def test_a_string_nested_deeper_than_json_is_read_is_redacted_as_text() -> None:
    arguments = "[" * 100_000 + '"ana@example.com"'
    assert redact_json(arguments) == "[" * 100_000 + f'"{EMAIL}"'
    deep_but_json = "[" * 150 + '"ana@example.com"' + "]" * 150
    assert redact_json(deep_but_json) == "[" * 150 + f'"{EMAIL}"' + "]" * 150


def test_a_value_nested_deeper_than_pythons_recursion_limit_is_walked() -> None:
    deep: list[Any] = ["ana@example.com"]
    for _ in range(100_000):
        deep = [deep]

    redacted = redact_json(deep)

    for _ in range(100_000):
        redacted = redacted[0]
    assert redacted == [EMAIL]


def test_envelope_keys_stay_only_on_messages_and_tool_calls_themselves() -> None:
    lookup = {
        "id": "call_4155552671",
        "type": "function",
        "function": {"name": "lookup", "arguments": json.dumps({"id": "ana@example.com"})},
    }
    result = json.dumps({"id": "ana@example.com", "type": "ana@example.com"})
    messages = [
        {"role": "assistant", "content": None, "tool_calls": [lookup]},
        {"role": "tool", "tool_call_id": "call_4155552671", "content": result},
        {"role": "user", "content": [{"type": "text", "text": "I am ana@example.com"}]},
    ]

    call, answer, asked = redact_json(messages)

    assert call["tool_calls"][0]["id"] == "call_4155552671"  # an id, not a phone number
    assert call["tool_calls"][0]["type"] == "function"
    assert json.loads(call["tool_calls"][0]["function"]["arguments"]) == {"id": EMAIL}
    assert answer["tool_call_id"] == "call_4155552671"
    assert json.loads(answer["content"]) == {"id": EMAIL, "type": EMAIL}
    assert asked["content"] == [{"type": "text", "text": f"I am {EMAIL}"}]
    # A structured output (an answer's text) is words, whatever its keys.
    structured = json.dumps({"id": "ana@example.com", "role": "ana@example.com"})
    assert json.loads(redact_json(structured)) == {"id": EMAIL, "role": EMAIL}
    assert redact_json({"content": "x", "tool_calls": [lookup]})["tool_calls"] == [
        {**lookup, "function": {"name": "lookup", "arguments": json.dumps({"id": EMAIL})}}
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # A word that looks like an IBAN's start ("ud80…" of an escaped surrogate) before one.
        ('{"note": "\\ud800 DE89 3704 0044 0532 0130 00 "}', f'{{"note": "\\ud800 {IBAN} "}}'),
        ("ref AB12 DE89 3704 0044 0532 0130 00 today", f"ref AB12 {IBAN} today"),
        # A stray group of digits before or after a card number.
        ("order 7 4111 1111 1111 1111 please", f"order 7 {CARD} please"),
        ("4111 1111 1111 1111 7 please", f"{CARD} 7 please"),
        # More groups before it than a candidate holds with it (found by review).
        ("row 1 2 3 4111 1111 1111 1111", f"row 1 2 3 {CARD}"),
        ("ab12 cd34 ef56 DE89 3704 0044 0532 0130 00", f"ab12 cd34 ef56 {IBAN}"),
        ("pay DE89 3704 0044 0532 0130 00 to a b c", f"pay {IBAN} to a b c"),
        # A digit after a phone number: the matcher took both as one candidate and dropped it
        # (found by the fuzzer on PostgreSQL's pass, written to the call log).
        ("\U0008f57b +1 650 253 0000 2\U00034211", f"\U0008f57b {PHONE} 2\U00034211"),
        ("call (650) 253-0000 2 times", f"call {PHONE} 2 times"),
        ("ref 12 +44 20 7946 0958 7", f"ref 12 {PHONE} 7"),
        ("+1 650 253 0000 2:30", f"{PHONE} 2:30"),
    ],
)
def test_a_number_is_found_among_the_groups_around_it(text: str, expected: str) -> None:
    """Found by the fuzzer: a candidate that began with something else hid the number in it."""
    assert redact(text).text == expected


def test_an_address_after_a_very_long_word_is_redacted() -> None:
    """Address candidates are whole runs matched once (a pattern with the "@" in it went back
    over every start of a long run: this text took minutes)."""
    text = "x" * 200_000 + " ana.lima@example.com " + "y" * 200_000 + "@"
    assert redact(text).text == "x" * 200_000 + f" {EMAIL} " + "y" * 200_000 + "@"


def test_keys_that_are_personal_data_are_redacted_and_kept_apart() -> None:
    """A tool's result keyed by the personal data itself (found by review)."""
    result = {"ana@example.com": {"plan": "gold"}, "bob@example.com": 2, "[email]": 3, "n": 4}
    assert redact_json(result) == {
        "[email] 2": {"plan": "gold"},
        "[email] 3": 2,
        "[email]": 3,
        "n": 4,
    }
    arguments = json.dumps({"+1 650 253 0000": "call"})
    assert json.loads(redact_json(arguments)) == {PHONE: "call"}
