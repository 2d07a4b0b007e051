"""Retrieve, then build the prompt: the one step the worker and the gateway share."""

from typing import Any

import pytest

from icrlhf.generation.context import prompt_context, request_signature
from icrlhf.integrations.vectors import VectorStoreUnavailable
from icrlhf.memory.selectors import Recall
from icrlhf.memory.signatures import PLAIN

CALL = {"id": "call_0", "type": "function", "function": {"name": "look_up", "arguments": "{}"}}
TOOLS = {"tools": [{"type": "function", "function": {"name": "look_up", "parameters": {}}}]}
AGENT = [
    {"role": "user", "content": "Where is my order?"},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_0", "content": "Shipped on Monday."},
]


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
    messages = context.messages(examples=context.recall.examples)
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
    messages = context.messages(examples=[])
    assert messages[1:] == conversation
    assert context.request == (None if last == "tool" else "And?")
