"""A reviewer's edit of a tool call, as fields: the tool (one the call offered) and one field
per argument of its JSON schema, typed as the schema says, then the whole checked against the
schema (jsonschema) before anything is saved.

The editor posts, for a candidate's call number i:
  toolcall_<candidate>_<i>_name                 the tool's name
  toolcall_<candidate>_<i>_<tool>__<argument>   one argument of that tool (every offered tool
                                                has its fields; only the named tool's count)
An empty optional field is left out; an argument whose schema is an object or an array is
written as JSON."""

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ValidationError
from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from icrlhf.generation.models import Candidate
from icrlhf.queues.models import Item


@dataclass(frozen=True)
class ArgumentField:
    """One argument of a tool, as the editor shows it."""

    name: str
    kind: str  # "string", "integer", "number", "boolean", "choice" or "json"
    required: bool
    description: str
    choices: tuple[str, ...] = ()


def tools_offered(call_options: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The function tools a call offered, by name: their JSON schema of parameters."""
    offered: dict[str, dict[str, Any]] = {}
    for tool in call_options.get("tools") or []:
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            parameters = function.get("parameters")
            offered[function["name"]] = parameters if isinstance(parameters, dict) else {}
    return offered


def argument_fields(parameters: Mapping[str, Any]) -> list[ArgumentField]:
    required = set(parameters.get("required") or [])
    fields = []
    for name, schema in (parameters.get("properties") or {}).items():
        schema = schema if isinstance(schema, dict) else {}
        kind = schema.get("type") if isinstance(schema.get("type"), str) else "json"
        if schema.get("enum"):
            kind = "choice"
        elif kind not in ("string", "integer", "number", "boolean"):
            kind = "json"
        fields.append(
            ArgumentField(
                name=name,
                kind=kind,
                required=name in required,
                description=str(schema.get("description") or ""),
                choices=tuple(str(value) for value in schema.get("enum") or ()),
            )
        )
    return fields


def field_name(candidate_id: int, index: int, tool: str = "", argument: str = "") -> str:
    base = f"toolcall_{candidate_id}_{index}"
    return f"{base}_name" if not tool else f"{base}_{tool}__{argument}"


def _typed(field: ArgumentField, raw: str, parameters: Mapping[str, Any], tool: str) -> Any:
    where = f"{tool}: {field.name}"
    if field.kind == "string":
        return raw
    if field.kind == "choice":
        # The schema's own value, with its type (an enum of numbers stays numbers).
        enum = (parameters.get("properties") or {})[field.name]["enum"]
        return next((value for value in enum if str(value) == raw), raw)
    if field.kind == "integer":
        try:
            return int(raw)
        except ValueError:
            raise ValidationError(f"{where} must be a whole number, not “{raw}”.") from None
    if field.kind == "number":
        try:
            return float(raw)
        except ValueError:
            raise ValidationError(f"{where} must be a number, not “{raw}”.") from None
    if field.kind == "boolean":
        if raw not in ("true", "false"):
            raise ValidationError(f"{where} must be true or false.")
        return raw == "true"
    try:
        return json.loads(raw)
    except ValueError:
        raise ValidationError(f"{where} must be JSON (an object or a list).") from None


def tool_calls_edited(
    *,
    data: Mapping[str, str],
    candidate_id: int,
    original: list[dict[str, Any]],
    call_options: Mapping[str, Any],
) -> list[dict[str, Any]] | None:
    """The candidate's tool calls as the reviewer's fields have them, checked against each
    tool's schema; None when the form carries no tool fields for this candidate (no editor)."""
    if field_name(candidate_id, 0) not in data:
        return None
    offered = tools_offered(call_options)
    edited = []
    for index, call in enumerate(original):
        tool = data.get(field_name(candidate_id, index), "")
        if tool not in offered:
            raise ValidationError(f"Call {index + 1}: choose one of the tools the call offered.")
        parameters = offered[tool]
        arguments: dict[str, Any] = {}
        for field in argument_fields(parameters):
            raw = data.get(field_name(candidate_id, index, tool, field.name), "").strip()
            if raw:
                arguments[field.name] = _typed(field, raw, parameters, tool)
        problem = best_match(Draft202012Validator(parameters).iter_errors(arguments))
        if problem is not None:
            where = ".".join(str(part) for part in problem.absolute_path)
            raise ValidationError(
                f"{tool}{': ' + where if where else ''}: {problem.message}. Nothing was saved."
            )
        edited.append(
            {
                "id": call.get("id") or f"call_{index}",
                "type": "function",
                "function": {"name": tool, "arguments": json.dumps(arguments, ensure_ascii=False)},
            }
        )
    return edited


def picked_calls_edited(
    *, item: Item, candidate_id: int | None, data: Mapping[str, str]
) -> list[dict[str, Any]] | None:
    """The picked candidate's tool calls as its field editor posted them, checked; None when
    it has no tool calls or no editor fields were posted."""
    if candidate_id is None:
        return None
    candidate = Candidate.objects.filter(pk=candidate_id, generation__item=item).first()
    if candidate is None or not candidate.tool_calls:
        return None
    return tool_calls_edited(
        data=data,
        candidate_id=candidate.pk,
        original=candidate.tool_calls,
        call_options=item.call_options,
    )
