"""OpenAI's rules for a chat fine-tuning line, as its fine-tuning guide and its data
preparation cookbook state them, checked after the line's messages and tools have passed the
`openai` package's own request types (pydantic validates their TypedDicts)."""

import json
from typing import Any

from openai.types.chat import ChatCompletionMessageParam, ChatCompletionToolUnionParam
from pydantic import TypeAdapter

_MESSAGES = TypeAdapter(list[ChatCompletionMessageParam])
_TOOLS = TypeAdapter(list[ChatCompletionToolUnionParam])
_ROLES = {"system", "developer", "user", "assistant", "tool"}
_KEYS = {"role", "content", "name", "weight", "tool_calls", "tool_call_id"}


def finetune_line_problems(line: dict[str, Any]) -> list[str]:
    """What OpenAI would refuse in one line of a chat fine-tuning file; [] when nothing."""
    problems: list[str] = []
    unknown = set(line) - {"messages", "tools", "parallel_tool_calls"}
    if unknown:
        problems.append(f"unknown keys {sorted(unknown)}")
    messages = line.get("messages")
    if not isinstance(messages, list) or not messages:
        return [*problems, "no messages"]
    _MESSAGES.validate_python([{k: v for k, v in m.items() if k != "weight"} for m in messages])
    tools = line.get("tools") or []
    _TOOLS.validate_python(tools)
    offered = {tool["function"]["name"] for tool in tools}
    pending: set[str] = set()
    for index, message in enumerate(messages):
        role = message.get("role")
        if role not in _ROLES:
            problems.append(f"message {index}: unknown role {role!r}")
        if set(message) - _KEYS:
            problems.append(f"message {index}: unknown keys {sorted(set(message) - _KEYS)}")
        if "weight" in message and (role != "assistant" or message["weight"] not in (0, 1)):
            problems.append(f"message {index}: weight is 0 or 1, on assistant messages only")
        calls = message.get("tool_calls") or []
        if not calls and not isinstance(message.get("content"), str | list):
            problems.append(f"message {index}: no content")
        for call in calls:
            function = call.get("function", {})
            if function.get("name") not in offered:
                problems.append(f"message {index}: calls {function.get('name')!r}, not a tool")
            try:
                json.loads(function.get("arguments"))
            except (TypeError, ValueError):
                problems.append(f"message {index}: arguments are not a JSON string")
            pending.add(call.get("id"))
        if role == "tool":
            if message.get("tool_call_id") not in pending:
                problems.append(f"message {index}: answers no earlier tool call")
            pending.discard(message.get("tool_call_id"))
    if messages[-1].get("role") != "assistant":
        problems.append("the last message is not the assistant's")
    if pending - {c.get("id") for c in messages[-1].get("tool_calls") or []}:
        problems.append(f"tool calls never answered: {sorted(pending)}")
    return problems
