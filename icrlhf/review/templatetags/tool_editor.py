"""The field editor of a candidate's tool calls (review/tool_edits.py reads what it posts)."""

from typing import Any

from django import template

from icrlhf.integrations import untrusted_json
from icrlhf.integrations.text_checks import storable
from icrlhf.review.tool_edits import (
    UnusableSchema,
    argument_fields,
    choice_text,
    field_name,
    tools_offered,
)

register = template.Library()


def _shown(value: Any, kind: str) -> str:
    """An argument's value as its field shows it."""
    if value is None:
        return ""
    if kind == "boolean":
        return "true" if value else "false"
    if kind == "choice":  # as its option says it, so that the option is the one selected
        return choice_text(value)
    if kind in ("string", "integer", "number") and isinstance(value, str | int | float):
        return str(value)
    return value if isinstance(value, str) else untrusted_json.dumps(value)


@register.inclusion_tag("review/_tool_call_editor.html")
def tool_call_editor(candidate: Any, call_options: dict[str, Any]) -> dict[str, Any]:
    offered = tools_offered(call_options or {})
    try:
        fields = {tool: argument_fields(parameters) for tool, parameters in offered.items()}
    except UnusableSchema:  # the application's schema: no editor, the text answer remains
        return {"calls": [], "offered": False}
    calls = []
    for index, call in enumerate(candidate.tool_calls or []):
        function = call.get("function") or {}
        try:
            arguments = untrusted_json.loads(function.get("arguments") or "{}")
        except untrusted_json.NotJson:
            arguments = {}
        arguments = arguments if isinstance(arguments, dict) else {}
        tools = [
            {
                "name": tool,
                "current": tool == function.get("name"),
                "fields": [
                    {
                        "field": field,
                        "input_name": field_name(candidate.pk, index, tool, field.name),
                        # Another tool's argument of the same name starts with this value:
                        # switching refund(order_id) to escalate(order_id) keeps the order.
                        # A lone surrogate (a "\\ud800" escape in the model's arguments)
                        # cannot be sent in a page: shown, and kept if posted, as U+FFFD.
                        "value": storable(_shown(arguments.get(field.name), field.kind)),
                    }
                    for field in fields[tool]
                ],
            }
            for tool in offered
        ]
        calls.append(
            {"number": index + 1, "name_field": field_name(candidate.pk, index), "tools": tools}
        )
    return {
        "calls": calls,
        "offered": bool(offered),
        "touched_field": f"toolcall_{candidate.pk}_touched",
    }
