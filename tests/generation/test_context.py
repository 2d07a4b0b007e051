"""Retrieve, then build the prompt: the one step the worker and the gateway share."""

from typing import Any

import pytest

from icrlhf.generation.context import PromptContext, Room, prompt_context, request_signature
from icrlhf.generation.prompts import Attempt
from icrlhf.integrations import llm
from icrlhf.integrations.vectors import VectorStoreUnavailable
from icrlhf.memory.selectors import Recall, RetrievedExample
from icrlhf.memory.signatures import PLAIN
from tests.factories import stored_example

CALL = {"id": "call_0", "type": "function", "function": {"name": "look_up", "arguments": "{}"}}
TOOLS = {"tools": [{"type": "function", "function": {"name": "look_up", "parameters": {}}}]}
AGENT = [
    {"role": "user", "content": "Where is my order?"},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_0", "content": "Shipped on Monday."},
]
WINDOW_UNKNOWN = Room(window=None, answer_tokens=0)


def test_a_request_follows_a_tool_result_only_when_the_result_is_last() -> None:
    assert request_signature(conversation=AGENT, options=TOOLS).after_tool_result
    person = [*AGENT, {"role": "user", "content": "Thanks, and the invoice?"}]
    assert not request_signature(conversation=person, options=TOOLS).after_tool_result
    assert request_signature(conversation=[], options={}) == PLAIN


def test_with_memory_down_the_prompt_is_built_without_examples(queue: Any) -> None:
    def down(**_: Any) -> Recall:
        raise VectorStoreUnavailable("The worker that owns the store did not answer.")

    context = prompt_context(
        queue=queue,
        query_text="Where is my card?",
        conversation=[],
        signature=PLAIN,
        pool=0,
        retrieve=down,
    )
    assert isinstance(context.memory_error, VectorStoreUnavailable)
    assert context.recall.examples == [] and context.recall.neighbours == []
    messages = context.fitted(examples=context.recall.examples, room=WINDOW_UNKNOWN).messages
    assert [m["role"] for m in messages] == ["system", "user"]
    assert messages[-1]["content"] == "Where is my card?"


@pytest.mark.parametrize("last", ["tool", "user"])
def test_a_conversation_is_sent_as_the_caller_sent_it(queue: Any, last: str) -> None:
    conversation = AGENT if last == "tool" else [*AGENT, {"role": "user", "content": "And?"}]
    context = prompt_context(
        queue=queue,
        query_text="Shipped on Monday.",
        conversation=conversation,
        signature=request_signature(conversation=conversation, options=TOOLS),
        pool=0,
        retrieve=lambda **_: Recall(examples=[], neighbours=[]),
    )
    messages = context.fitted(examples=[], room=WINDOW_UNKNOWN).messages
    assert messages[1:] == conversation
    assert context.request == (None if last == "tool" else "And?")


# The prompt fits the model's context window: the window is a number here (the fit's input);
# where it comes from is tested in tests/integrations/test_llm_context_window.py.


def context_of(queue: Any, conversation: list[dict[str, Any]] | None = None) -> PromptContext:
    return prompt_context(
        queue=queue,
        query_text="Where is my card?",
        conversation=conversation or [],
        signature=PLAIN,
        pool=0,
        retrieve=lambda **_: Recall(examples=[], neighbours=[]),
    )


def retrieved(queue: Any, count: int) -> list[RetrievedExample]:
    """`count` long examples, most similar first, as retrieval returns them."""
    return [
        RetrievedExample(
            example=stored_example(
                queue,
                input_text=f"Request {rank}: my card has not arrived. " + "Still waiting. " * 40,
                output_text=f"Answer {rank}: it is on its way.",
            ),
            score=0.9 - rank / 100,
            rank=rank,
        )
        for rank in range(1, count + 1)
    ]


def window_for(messages: list[dict[str, Any]], *, answer_tokens: int) -> Room:
    """A room exactly as large as `messages` need with an answer of `answer_tokens`."""
    need = Room(window=None, answer_tokens=answer_tokens).needed(messages)
    return Room(window=need, answer_tokens=answer_tokens)


def test_a_prompt_that_fits_goes_whole(queue: Any) -> None:
    examples = retrieved(queue, 3)
    context = context_of(queue)
    whole = context.fitted(examples=examples, room=WINDOW_UNKNOWN)
    sent = context.fitted(examples=examples, room=window_for(whole.messages, answer_tokens=50))
    assert sent == whole and sent.examples == examples


def test_the_least_similar_examples_are_dropped_first_with_room_for_the_answer(
    queue: Any,
) -> None:
    examples = retrieved(queue, 3)
    context = context_of(queue)
    two = context.fitted(examples=examples[:2], room=WINDOW_UNKNOWN).messages
    room = window_for(two, answer_tokens=100)
    assert not room.fits(context.fitted(examples=examples, room=WINDOW_UNKNOWN).messages)

    sent = context.fitted(examples=examples, room=room)
    assert sent.examples == examples[:2] and sent.messages == two
    assert "Request 3" not in sent.messages[0]["content"]
    # The same window with a longer answer to make room for holds one example fewer.
    longer_answer = Room(window=room.window, answer_tokens=room.answer_tokens + 50)
    assert context.fitted(examples=examples, room=longer_answer).examples == examples[:1]


def test_after_every_example_the_oldest_attempts_are_dropped(queue: Any) -> None:
    examples = retrieved(queue, 2)
    attempts = [Attempt(f"Attempt {n}: " + "Try this. " * 30, reward=0.1 * n) for n in range(3)]
    context = context_of(queue)
    latest_two = context.fitted(
        examples=[], attempts=attempts[1:], attempts_feedback="Too vague.", room=WINDOW_UNKNOWN
    )

    sent = context.fitted(
        examples=examples,
        attempts=attempts,
        attempts_feedback="Too vague.",
        room=window_for(latest_two.messages, answer_tokens=20),
    )
    assert sent.examples == [] and sent.attempts == attempts[1:]
    system = sent.messages[0]["content"]
    assert "Attempt 0" not in system and "Attempt 1" in system and "Attempt 2" in system


def test_the_callers_conversation_is_never_cut(queue: Any) -> None:
    """A conversation longer than the window goes whole, alone: the upstream says it is too
    long, as it did before the fit."""
    conversation = [*AGENT, {"role": "user", "content": "And my invoice? " * 200}]
    context = context_of(queue, conversation)
    attempts = [Attempt("An earlier answer.", reward=0.0)]
    sent = context.fitted(
        examples=retrieved(queue, 2), attempts=attempts, room=Room(window=300, answer_tokens=50)
    )
    assert sent.examples == [] and sent.attempts == []
    assert sent.messages[1:] == conversation
    assert "Request 1" not in sent.messages[0]["content"]
    assert "An earlier answer." not in sent.messages[0]["content"]


def test_the_tools_a_call_offers_take_room_in_the_window(queue: Any) -> None:
    examples = retrieved(queue, 2)
    context = context_of(queue)
    room = window_for(
        context.fitted(examples=examples, room=WINDOW_UNKNOWN).messages, answer_tokens=0
    )
    tools = [{**TOOLS["tools"][0], "description": "Looks an order up. " * 40}]
    with_tools = Room(window=room.window, answer_tokens=0, tools=tools)
    assert context.fitted(examples=examples, room=room).examples == examples
    assert len(context.fitted(examples=examples, room=with_tools).examples) < 2


def test_a_calls_room_is_its_models_window_less_its_max_tokens(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[tuple[str, str]] = []

    def context_window_double(model: str, api_base: str = "") -> int | None:
        asked.append((model, api_base))
        return 4096

    monkeypatch.setattr(llm, "context_window", context_window_double)
    room = Room.of_call(
        model="openai/big",
        api_base="http://llm.example/v1",
        params={"temperature": 0.2, "max_tokens": 300},
        options=TOOLS,
    )
    assert asked == [("openai/big", "http://llm.example/v1")]
    assert room == Room(window=4096, answer_tokens=300, tools=TOOLS["tools"])
