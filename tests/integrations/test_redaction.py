"""Redaction: each kind found and confirmed by its library, placeholders in its place, and
look-alikes (numbers failing their checksum, broken addresses) left alone."""

import json

import pytest

from icrlhf.integrations.redaction import CARD, EMAIL, IBAN, PHONE, redact, redact_json


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
