"""A tool call made again after its result came back: what memory never teaches.

An agent that looks an order up, gets the answer, then looks the same order up again is in a
loop, and a stored step that does so teaches the loop to every similar decision point (a small
model copied one 50 times in a row). So a step example is not retrieved for a conversation
that already holds its action's call, with the same arguments, answered; nor for anyone when
its own turns show the loop. The run's page flags such a step with the same test.

A call "repeats" another when both name the same function with the same arguments, compared
as parsed JSON (`{"a": 1, "b": 2}` is `{"b":2,"a":1}`), and counts only once a tool message
has answered the first: a call still waiting for its result is not a loop. A job polled until
it is done repeats its call on purpose; memory then teaches no poll, and the model may still
poll on its own.
"""

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from icrlhf.integrations import untrusted_json
from icrlhf.memory.selectors import RetrievedExample

Message = dict[str, Any]


@dataclass(frozen=True)
class CallKey:
    """What makes two tool calls the same call: the function and its arguments."""

    name: str
    arguments: str  # canonical JSON; the text as sent when it is not JSON

    @classmethod
    def of(cls, call: dict[str, Any]) -> "CallKey":
        function = call.get("function") or {}
        return cls(str(function.get("name") or ""), _canonical(function.get("arguments")))


def _canonical(arguments: Any) -> str:
    parsed = arguments
    if isinstance(arguments, str):
        try:
            parsed = untrusted_json.loads(arguments)
        except untrusted_json.NotJson:  # a model's broken JSON, or nesting too deep to read
            return arguments.strip()
    return json.dumps(parsed, sort_keys=True, separators=(",", ":"))


def answered_calls(messages: Sequence[Message]) -> dict[CallKey, int]:
    """Each call in `messages` that a tool message answered, with the index of the assistant
    message that first made it. A tool message answers the latest call with its id (some
    agents number their calls `call_0` afresh at each step)."""
    made: dict[str, tuple[CallKey, int]] = {}
    answered: dict[CallKey, int] = {}
    for index, message in enumerate(messages):
        if message.get("role") == "assistant":
            for call in message.get("tool_calls") or []:
                made[str(call.get("id"))] = (CallKey.of(call), index)
        elif message.get("role") == "tool":
            found = made.get(str(message.get("tool_call_id")))
            if found is not None:
                answered.setdefault(*found)
    return answered


def repeated_calls(
    tool_calls: Sequence[dict[str, Any]], messages: Sequence[Message]
) -> dict[CallKey, int]:
    """The calls among `tool_calls` that `messages` already made and got the result of, each
    with the index of the assistant message that made it first (empty: no repeat)."""
    answered = answered_calls(messages)
    return {
        key: answered[key] for key in (CallKey.of(call) for call in tool_calls) if key in answered
    }


def _action(turns: Sequence[Message]) -> tuple[list[dict[str, Any]], Sequence[Message]]:
    """A step example's action (its last assistant message: the tool messages after it, when
    kept, are its results): the action's tool calls, and the turns before it."""
    for index in range(len(turns) - 1, -1, -1):
        if turns[index].get("role") == "assistant":
            return list(turns[index].get("tool_calls") or []), turns[:index]
    return [], turns


def teaches_a_loop(turns: Sequence[Message]) -> bool:
    """Whether a step example's action repeats a call its own turns already answered."""
    calls, before = _action(turns)
    return bool(repeated_calls(calls, before))


def without_repeats(
    conversation: Sequence[Message], retrieved: Sequence[RetrievedExample]
) -> list[RetrievedExample]:
    """`retrieved` (in order, ranked again from 1) without the step examples whose action
    repeats a call that `conversation` (the caller's OpenAI messages) already holds with its
    result, nor those whose own turns show that loop. Examples without turns (plain answers)
    make no calls and are all kept."""
    answered = answered_calls(conversation)
    kept: list[RetrievedExample] = []
    for hit in retrieved:
        calls, before = _action(hit.example.turns or [])
        if any(CallKey.of(call) in answered for call in calls) or repeated_calls(calls, before):
            continue
        kept.append(replace(hit, rank=len(kept) + 1))
    return kept
