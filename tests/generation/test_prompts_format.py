"""Format examples in the prompt: sent first, as turns (a call's form is the one the model's
server renders calls in), under a system note that their tools are not offered."""

from typing import Any

from icrlhf.generation.prompts import FORMAT_PREAMBLE, STEPS_PREAMBLE, PromptExample, messages_build


def _step(question: str, tool: str, *, format_only: bool = False) -> PromptExample:
    call = {"id": "call_0", "type": "function", "function": {"name": tool, "arguments": "{}"}}
    turns: tuple[dict[str, Any], ...] = (
        {"role": "user", "content": question},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_0", "content": "done"},
    )
    return PromptExample(question, f"{tool}()", turns, format_only=format_only)


def _built(examples: list[PromptExample]) -> list[dict[str, Any]]:
    return messages_build(
        system_prompt="You help.",
        guidelines="",
        guidelines_version=1,
        examples=examples,
        request="Weather in Paris?",
    )


def test_format_examples_come_first_as_turns_under_their_note() -> None:
    sent = _built(
        [
            _step("Weather in Rome?", "get_weather"),
            _step("Book a flight.", "book_flight", format_only=True),
            _step("Find a hotel.", "find_hotels", format_only=True),
        ]
    )
    system = sent[0]["content"]
    assert FORMAT_PREAMBLE.format(count=2) in system and STEPS_PREAMBLE in system
    called = [m["tool_calls"][0]["function"]["name"] for m in sent if m.get("tool_calls")]
    # Least similar first, and every format example before the request's own tools' steps.
    assert called == ["find_hotels", "book_flight", "get_weather"]
    ids = [m["tool_calls"][0]["id"] for m in sent if m.get("tool_calls")]
    assert len(set(ids)) == 3 and ids[0].startswith("format")
    assert sent[-1] == {"role": "user", "content": "Weather in Paris?"}


def test_format_examples_alone_say_their_tools_are_not_offered() -> None:
    sent = _built([_step("Book a flight.", "book_flight", format_only=True)])
    assert FORMAT_PREAMBLE.format(count=1) in sent[0]["content"]
    assert STEPS_PREAMBLE not in sent[0]["content"]


def test_a_format_example_is_never_sent_with_a_reward() -> None:
    class Stored:
        input_text, output_text, reward = "Book a flight.", "book_flight()", 1.0
        turns = [{"role": "user", "content": "Book a flight."}]

    example = PromptExample.of(Stored(), rewarded=True, rivals=[], format_only=True)
    assert example.format_only and example.reward is None and example.rivals == ()
