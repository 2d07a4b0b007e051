"""A reviewer's edit of a tool call, as fields: the tool (one the call offered) and one field
per argument of its JSON schema, typed as the schema says, then the whole checked against the
schema (jsonschema) before anything is saved.

The editor posts, for a candidate's call number i:
  toolcall_<candidate>_touched                  "1" once the reviewer changed a field (set by
                                                review.js): untouched fields are a plain pick
  toolcall_<candidate>_<i>_name                 the tool's name
  toolcall_<candidate>_<i>_<tool>__<argument>   one argument of that tool (every offered tool
                                                has its fields; only the named tool's count)
An empty optional field is left out; an argument whose schema is an object or an array is
written as JSON. Arguments the schema does not list are kept as the model wrote them.

The schemas come from the calling application: nothing they reference is fetched (an empty
registry), and one that cannot be read or checked gives no editor, or a refusal that says
so — never an error page."""

import json
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ValidationError
from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match
from referencing import Registry

from icrlhf.generation.models import Candidate
from icrlhf.integrations import untrusted_json
from icrlhf.queues.models import Item

logger = logging.getLogger(__name__)


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


class UnusableSchema(Exception):
    """A tool's parameters that the editor cannot turn into fields."""


_PRIMITIVES = ("string", "integer", "number", "boolean")


def _kind(schema: Mapping[str, Any]) -> str:
    kind = schema.get("type")
    if isinstance(kind, list):  # ["string", "null"]: the one real type, when there is one
        real = [k for k in kind if k != "null"]
        kind = real[0] if len(real) == 1 else None
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return "choice"
    return kind if kind in _PRIMITIVES else "json"


def choice_text(value: Any) -> str:
    """An enum value as its option says it (a string as it is, anything else as JSON)."""
    return value if isinstance(value, str) else json.dumps(value)


def argument_fields(parameters: Mapping[str, Any]) -> list[ArgumentField]:
    """One field per property of the schema; UnusableSchema when it is not one."""
    properties = parameters.get("properties") or {}
    required = parameters.get("required") or []
    if not isinstance(properties, dict) or not isinstance(required, list):
        raise UnusableSchema("its properties or required list are not what JSON Schema says")
    required_names = {str(name) for name in required}
    fields = []
    for name, schema in properties.items():
        schema = schema if isinstance(schema, dict) else {}
        enum = schema.get("enum")
        fields.append(
            ArgumentField(
                name=str(name),
                kind=_kind(schema),
                required=str(name) in required_names,
                description=str(schema.get("description") or ""),
                choices=tuple(choice_text(v) for v in enum) if isinstance(enum, list) else (),
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
        return next((value for value in enum if choice_text(value) == raw), raw)
    if field.kind == "integer":
        try:
            return int(raw)
        except ValueError:
            raise ValidationError(f"{where} must be a whole number, not “{raw}”.") from None
    if field.kind == "number":
        try:
            number = float(raw)
        except ValueError:
            number = math.nan
        if not math.isfinite(number):
            raise ValidationError(f"{where} must be a number, not “{raw}”.")
        return number
    if field.kind == "boolean":
        if raw not in ("true", "false"):
            raise ValidationError(f"{where} must be true or false.")
        return raw == "true"
    try:
        return untrusted_json.loads(raw)
    except untrusted_json.NotJson as error:
        raise ValidationError(f"{where} must be JSON (an object or a list): {error}.") from None


def _schema_problem(parameters: Mapping[str, Any], arguments: dict[str, Any]) -> str | None:
    """What the schema says is wrong with the arguments; an unreadable schema says so."""
    try:
        Draft202012Validator.check_schema(parameters)
        # An empty registry: a $ref to a URL or a file is never fetched.
        validator = Draft202012Validator(parameters, registry=Registry())
        problem = best_match(validator.iter_errors(arguments))
    except Exception as error:  # the application's schema: anything may be wrong with it
        logger.info("A tool schema could not be checked: %r", error)
        return (
            "its schema cannot be checked (it is invalid, or points at other documents); "
            "answer in words instead"
        )
    if problem is None:
        return None
    where = ".".join(str(part) for part in problem.absolute_path)
    return f"{where + ': ' if where else ''}{problem.message}"


def _arguments_of(call: Mapping[str, Any]) -> dict[str, Any]:
    try:
        arguments = untrusted_json.loads((call.get("function") or {}).get("arguments") or "{}")
    except untrusted_json.NotJson:
        return {}
    return arguments if isinstance(arguments, dict) else {}


def tool_calls_edited(
    *,
    data: Mapping[str, str],
    candidate_id: int,
    original: list[dict[str, Any]],
    call_options: Mapping[str, Any],
) -> list[dict[str, Any]] | None:
    """The candidate's tool calls as the reviewer changed them in the fields, checked against
    each tool's schema; None when the fields were not touched (a pick as it is)."""
    if data.get(f"toolcall_{candidate_id}_touched") != "1":
        return None
    offered = tools_offered(call_options)
    edited = []
    for index, call in enumerate(original):
        tool = data.get(field_name(candidate_id, index), "")
        if tool not in offered:
            raise ValidationError(f"Call {index + 1}: choose one of the tools the call offered.")
        parameters = offered[tool]
        try:
            fields = argument_fields(parameters)
        except UnusableSchema as error:
            raise ValidationError(f"{tool}: {error}; answer in words instead.") from None
        # Unlisted arguments stay as the model wrote them (when the tool stays the same).
        same_tool = (call.get("function") or {}).get("name") == tool
        listed = {field.name for field in fields}
        arguments = {k: v for k, v in _arguments_of(call).items() if same_tool and k not in listed}
        for field in fields:
            raw = data.get(field_name(candidate_id, index, tool, field.name), "")
            if raw.strip():
                arguments[field.name] = _typed(field, raw, parameters, tool)
        problem = _schema_problem(parameters, arguments)
        if problem is not None:
            raise ValidationError(f"{tool}: {problem}. Nothing was saved.")
        edited.append(
            {
                "id": call.get("id") or f"call_{index}",
                "type": "function",
                "function": {
                    "name": tool,
                    "arguments": untrusted_json.dumps(arguments),
                },
            }
        )
    return edited


def picked_calls_edited(
    *, item: Item, candidate_id: int | None, data: Mapping[str, str]
) -> list[dict[str, Any]] | None:
    """The picked candidate's tool calls as its field editor changed them, checked; None when
    it has no tool calls or its fields were not touched."""
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
