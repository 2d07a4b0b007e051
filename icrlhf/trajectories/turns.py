"""A run as OpenAI turns: what the agent had seen before each step, the step's action, and
the tool results that answered it. The reward rule and the exports read runs this way."""

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from icrlhf.memory import signatures

Message = dict[str, Any]


class StepLike(Protocol):
    """A step as a Step row has it, or as an exported record's step is read back."""

    observation: list[Message]
    action_text: str
    tool_calls: list[dict[str, Any]]


def step_message(*, text: str, tool_calls: list[dict[str, Any]]) -> Message:
    """A step's action as the assistant message that took it. A step keeps no words beside
    its tool calls (`step_record`), so a step's message carries none either."""
    return signatures.action_message("" if tool_calls else text, tool_calls)


@dataclass(frozen=True)
class StepTurns[S: StepLike]:
    step: S
    before: list[Message]  # the conversation the step decided on
    action: Message
    results: list[Message]  # the tool messages that answered this step's calls


def step_turns[S: StepLike](
    steps: Iterable[S], clean: Callable[[Message], Message] = lambda message: message
) -> Iterator[StepTurns[S]]:
    """Each step of a run (given in order) with its turns, every message passed through
    `clean` (the reward rule redacts what memory keeps)."""
    ordered = list(steps)
    conversation: list[Message] = []
    for step, following in zip(ordered, [*ordered[1:], None], strict=True):
        conversation += [clean(m) for m in step.observation]
        answered = {call.get("id") for call in step.tool_calls}
        results = [
            clean(m)
            for m in (following.observation if following is not None else [])
            if m.get("role") == "tool" and m.get("tool_call_id") in answered
        ]
        action = clean(step_message(text=step.action_text, tool_calls=step.tool_calls))
        yield StepTurns(step=step, before=list(conversation), action=action, results=results)
        conversation.append(action)
