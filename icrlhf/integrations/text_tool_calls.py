"""Tool calls a model wrote as text. Small models trained on code write a call as a JSON object
in their answer instead of in their template's markup: Qwen2.5-Coder answers a request with
tools as ```json {"name": …, "arguments": {…}} ```, which llama.cpp's parser, waiting for
<tool_call> tags, passes on as words. An answer is read as calls here only when all of it is
calls, each naming a tool the request offers with an object of arguments: words around a JSON
block, or a JSON answer that names no offered tool, stay words.

Streamed answers are held back while they could still turn out to be calls
(`could_become_calls`), so a caller never receives as words what it then receives as calls."""

import re
import uuid
from typing import Any

from icrlhf.integrations import untrusted_json

# A fenced block (```json … ```), or the Hermes tags a template asked for but its parser missed.
_FENCE = re.compile(r"```[ \t]*(?:json)?[ \t]*\n(.*?)\n?[ \t]*```", re.DOTALL | re.IGNORECASE)
_TAGGED = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
# How a calls-only answer can begin: a fence, a tag, or the JSON itself.
_OPENINGS = ("```", "<tool_call>", "{", "[")


def offered_tools(options: dict[str, Any] | None) -> frozenset[str]:
    """The names of the tools a request offers, unless it turned them off (tool_choice none)."""
    if not options or options.get("tool_choice") == "none":
        return frozenset()
    tools = options.get("tools")
    if not isinstance(tools, list):
        return frozenset()
    return frozenset(
        function["name"]
        for tool in tools
        if isinstance(tool, dict)
        and isinstance(function := tool.get("function"), dict)
        and isinstance(function.get("name"), str)
    )


def could_become_calls(text: str) -> bool:
    """Whether an answer that has begun with `text` may still be calls only."""
    start = text.lstrip()[: len("<tool_call>")]
    if start.startswith("```"):
        language = text.lstrip()[3:].split("\n", 1)
        return len(language) == 1 or language[0].strip().lower() in {"", "json"}
    return any(opening.startswith(start) or start.startswith(opening) for opening in _OPENINGS)


def calls_in_text(text: str, offered: frozenset[str]) -> tuple[dict[str, Any], ...]:
    """The tool calls `text` consists of, in OpenAI's shape, or () when it is not calls only."""
    if not offered or not could_become_calls(text):
        return ()
    values = _json_values(text.strip())
    calls: list[dict[str, Any]] = []
    for value in values:
        for item in value if isinstance(value, list) else [value]:
            call = _call(item, offered)
            if call is None:
                return ()
            calls.append(call)
    return tuple(calls)


def _json_values(text: str) -> list[Any]:
    """The JSON values `text` holds: its fenced or tagged blocks when nothing else is there,
    else the whole text as one value, else one value a line; [] when any part is not JSON."""
    for blocks in (_FENCE, _TAGGED):
        if blocks.search(text) and not blocks.sub("", text).strip():
            pieces = [match.group(1) for match in blocks.finditer(text)]
            break
    else:
        pieces = [text]
    values: list[Any] = []
    for piece in pieces:
        try:
            values.append(untrusted_json.loads(piece))
        except untrusted_json.NotJson:
            lines = [line for line in piece.splitlines() if line.strip()]
            try:  # one call a line
                values.extend(untrusted_json.loads(line) for line in lines)
            except untrusted_json.NotJson:
                return []
    return values


def _call(item: Any, offered: frozenset[str]) -> dict[str, Any] | None:
    """{"name": an offered tool, "arguments" (or "parameters"): an object, or a JSON text of
    one} as an OpenAI tool call, else None."""
    if not isinstance(item, dict) or item.get("name") not in offered:
        return None
    arguments = item.get("arguments", item.get("parameters"))
    if isinstance(arguments, str):
        try:
            arguments = untrusted_json.loads(arguments)
        except untrusted_json.NotJson:
            return None
    if not isinstance(arguments, dict):
        return None
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": item["name"], "arguments": untrusted_json.dumps(arguments)},
    }
