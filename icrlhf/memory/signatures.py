"""What a step was made under: the tools offered and the output format required.

An example made with tools may show a call to any of them, so it is offered only to a request
that offers them all; one made for a JSON schema teaches that schema's shape, so it is offered
only where the same format is required (and a plain text example never where one is). A
step that follows a tool result is an agent's next move, not a reply to a person: only other
agents' steps are offered there. A tool call of another tool set may still be offered as a
format example (`admits_as_format`): it shows how a call is written, never which tool to call,
and a call that names a tool the request did not offer never reaches the caller
(`foreign_calls`)."""

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Signature:
    tool_names: frozenset[str] = frozenset()
    # The response_format asked for ({} for text), as the caller sent it.
    output_format: tuple[tuple[str, str], ...] = ()
    after_tool_result: bool = False

    @classmethod
    def of(
        cls,
        *,
        tools: list[dict[str, Any]] | None,
        response_format: dict[str, Any] | None,
        after_tool_result: bool = False,
    ) -> "Signature":
        return cls(
            tool_names=frozenset(tool_names(tools)),
            output_format=_canonical(response_format),
            after_tool_result=after_tool_result,
        )

    @classmethod
    def of_options(cls, options: dict[str, Any], *, after_tool_result: bool = False) -> "Signature":
        """From a call's tool and output fields, as the gateway passes them on."""
        return cls.of(
            tools=options.get("tools"),
            response_format=options.get("response_format"),
            after_tool_result=after_tool_result,
        )

    def admits(self, *, tool_names: list[str], output_format: dict[str, Any]) -> bool:
        """Whether an example made under that signature may be offered to this request."""
        if self.after_tool_result and not tool_names:
            return False
        return set(tool_names) <= self.tool_names and _canonical(output_format) == (
            self.output_format
        )

    def admits_as_format(self, *, tool_names: list[str], output_format: dict[str, Any]) -> bool:
        """Whether an example made under that signature may be offered to this request as a
        format example only: a tool call of another tool set, which shows how a call is
        written (for a new tool set, or a first call, no example would show it), never which
        tool to call. Only to a request that offers tools, in the same output format."""
        return (
            bool(self.tool_names)
            and bool(tool_names)
            and not set(tool_names) <= self.tool_names
            and _canonical(output_format) == self.output_format
        )

    def as_json(self) -> dict[str, Any]:
        """For a task's arguments (the embedded store's owner retrieves for other processes)."""
        return {
            "tool_names": sorted(self.tool_names),
            "output_format": dict(self.output_format),
            "after_tool_result": self.after_tool_result,
        }

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> "Signature":
        return cls(
            tool_names=frozenset(value.get("tool_names", [])),
            output_format=tuple(sorted(value.get("output_format", {}).items())),
            after_tool_result=bool(value.get("after_tool_result", False)),
        )


PLAIN = Signature()


def tool_names(tools: list[dict[str, Any]] | None) -> list[str]:
    return sorted({tool["function"]["name"] for tool in tools or []})


def foreign_calls(
    tool_calls: Sequence[dict[str, Any]], tools: list[dict[str, Any]] | None
) -> list[dict[str, Any]]:
    """The calls that name a tool the request did not offer (a model shown other tool sets'
    calls may copy one): never returned to the caller."""
    offered = set(tool_names(tools))
    return [call for call in tool_calls if call.get("function", {}).get("name") not in offered]


def output_format(options: dict[str, Any]) -> dict[str, Any]:
    """The output format a call's options ask for, as a step keeps it ({} for plain text)."""
    asked: dict[str, Any] = options.get("response_format") or {}
    return {} if asked.get("type") == "text" else asked


def _canonical(response_format: dict[str, Any] | None) -> tuple[tuple[str, str], ...]:
    """A format as a comparable value: `text` is no format; the rest compare by their whole
    JSON (two schemas that differ in one field are two formats)."""
    if not response_format or response_format.get("type") == "text":
        return ()
    return tuple(
        sorted((key, json.dumps(value, sort_keys=True)) for key, value in response_format.items())
    )


def action_message(text: str, tool_calls: list[dict[str, Any]]) -> dict[str, Any]:
    """An action as the assistant message that took it, in OpenAI's shape: its words, and its
    tool calls with the words beside them (`content` None when there are none)."""
    if not tool_calls:
        return {"role": "assistant", "content": text}
    return {"role": "assistant", "content": text or None, "tool_calls": tool_calls}


def action_text(text: str, tool_calls: list[dict[str, Any]]) -> str:
    """An action as one text (for the admin, exports and the similarity of answers): its
    words, then each tool call as `name(arguments)`."""
    calls = [f"{c['function']['name']}({c['function'].get('arguments', '')})" for c in tool_calls]
    return "\n".join(filter(None, [text.strip(), *calls]))


def step_action(turns: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """A stored step's action: its last assistant turn (the results of its tool calls, where
    known, follow it). None for a step without one."""
    return next((turn for turn in reversed(turns) if turn.get("role") == "assistant"), None)
