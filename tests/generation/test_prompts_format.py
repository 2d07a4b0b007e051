"""Format examples in the prompt: only the form of a call (tool and argument names, each value a
placeholder of its type), never its request, words, values or results; first, under a note
that their tools are not offered; quoted in the system message where the queue quotes its
examples, as turns where it sends them as turns."""

import json
from typing import Any

from icrlhf.generation.prompts import (
    FORMAT_PREAMBLE,
    FORMAT_REFERENCE_PREAMBLE,
    REFERENCE,
    STEPS_PREAMBLE,
    TURNS,
    PromptExample,
    call_form,
    messages_build,
)

# Words of another caller's step: none may reach a prompt that shows its call as a format.
SECRETS = ("Book a flight", "Jane Roe", "jane@example.com", "Booking now", "AF123", "4417")


def _turns(question: str, tool: str, **arguments: Any) -> tuple[dict[str, Any], ...]:
    call = {
        "id": "call_0",
        "type": "function",
        "function": {"name": tool, "arguments": json.dumps(arguments)},
    }
    return (
        {"role": "user", "content": question},
        {"role": "assistant", "content": "Booking now.", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_0", "content": "Booked AF123."},
    )


def _step(question: str, tool: str, *, format_only: bool = False) -> PromptExample:
    turns = _turns(question, tool, passenger="Jane Roe", email="jane@example.com")
    return PromptExample(question, f"{tool}()", turns, format_only=format_only)


def _built(examples: list[PromptExample], framing: str = REFERENCE) -> list[dict[str, Any]]:
    return messages_build(
        system_prompt="You help.",
        playbook="",
        playbook_version=None,
        examples=examples,
        request="Weather in Paris?",
        framing=framing,
    )


def test_a_calls_form_keeps_names_and_the_types_of_values_only() -> None:
    turns = _turns(
        "Book a flight for Jane Roe, card 4417.",
        "book_flight",
        passenger="Jane Roe",
        seats=2,
        price=99.5,
        window=True,
        note=None,
        names=["Jane Roe"],
        card={"number": "4417"},
    )
    form = call_form(turns)
    assert form is not None
    assert form["role"] == "assistant" and form["content"] is None
    [call] = form["tool_calls"]
    assert call["function"]["name"] == "book_flight"
    assert json.loads(call["function"]["arguments"]) == {
        "passenger": "<string>",
        "seats": 0,
        "price": 0.0,
        "window": False,
        "note": None,
        "names": [],
        "card": {},
    }
    assert not any(secret in json.dumps(form) for secret in SECRETS)


def test_a_calls_form_redacts_an_argument_name_that_is_personal_data() -> None:
    form = call_form(_turns("Mail her.", "send", **{"jane@example.com": "hello"}))
    assert form is not None
    assert "jane@example.com" not in json.dumps(form)


def test_a_call_whose_arguments_cannot_be_read_has_the_form_of_no_arguments() -> None:
    """A stored call's arguments nested deeper than JSON is read (the gateway answers such
    a call, and stores it) must not break every prompt it would be a format example in."""
    user, assistant, result = _turns("Look it up.", "lookup", q="x")
    deep = "[" * 100_000 + "]" * 100_000
    call = {**assistant["tool_calls"][0], "function": {"name": "lookup", "arguments": deep}}
    form = call_form((user, {**assistant, "tool_calls": [call]}, result))
    assert form is not None
    assert form["tool_calls"][0]["function"]["arguments"] == "{}"


def test_a_step_without_a_call_has_no_form() -> None:
    assert call_form([{"role": "assistant", "content": "I cannot book flights."}]) is None


def test_format_examples_as_turns_come_first_and_carry_only_the_form() -> None:
    sent = _built(
        [
            _step("Weather in Rome?", "get_weather"),
            _step("Book a flight.", "book_flight", format_only=True),
            _step("Find a hotel.", "find_hotels", format_only=True),
        ],
        framing=TURNS,
    )
    system = sent[0]["content"]
    assert FORMAT_PREAMBLE.format(count=2) in system and STEPS_PREAMBLE in system
    called = [m["tool_calls"][0]["function"]["name"] for m in sent if m.get("tool_calls")]
    # Least similar first, and every format example before the request's own tools' steps.
    assert called == ["find_hotels", "book_flight", "get_weather"]
    ids = [m["tool_calls"][0]["id"] for m in sent if m.get("tool_calls")]
    assert len(set(ids)) == 3 and ids[0].startswith("format")
    assert sent[-1] == {"role": "user", "content": "Weather in Paris?"}
    formats = json.dumps(sent[1:7])  # the two format examples: request, call, empty result
    assert "find_hotels" in formats and "book_flight" in formats
    assert not any(secret in formats for secret in SECRETS) and "Find a hotel" not in formats


def test_format_examples_where_examples_are_quoted_are_quoted_too() -> None:
    sent = _built([_step("Book a flight.", "book_flight", format_only=True)])
    assert [m["role"] for m in sent] == ["system", "user"]  # no turns anyone can ask back
    system = sent[0]["content"]
    assert FORMAT_REFERENCE_PREAMBLE in system and FORMAT_PREAMBLE.format(count=1) not in system
    assert '{"name": "book_flight", "arguments": {"passenger": "<string>"' in system
    assert not any(secret in json.dumps(sent) for secret in SECRETS)


def test_format_examples_alone_say_their_tools_are_not_offered() -> None:
    sent = _built([_step("Book a flight.", "book_flight", format_only=True)], framing=TURNS)
    assert FORMAT_PREAMBLE.format(count=1) in sent[0]["content"]
    assert STEPS_PREAMBLE not in sent[0]["content"]


def test_a_format_example_is_only_its_form_never_with_a_reward() -> None:
    class Stored:
        input_text, output_text, reward = "Book a flight.", "book_flight()", 1.0
        turns = list(_turns("Book a flight.", "book_flight", passenger="Jane Roe"))

    example = PromptExample.of(Stored(), rewarded=True, rivals=[], format_only=True)
    assert example.format_only and example.reward is None and example.rivals == ()
    assert example.input_text == "" and example.output_text == ""
    assert example.turns == (call_form(Stored.turns),)
