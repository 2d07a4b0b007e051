"""Text (and numbers) the database can store, checked once where a request comes in.

PostgreSQL refuses a NUL character (0x00) in text and in JSON, and a lone surrogate (half of a
UTF-16 pair, U+D800 to U+DFFF: what `json.loads` makes of a "\\ud800" escape without its other
half) cannot be encoded as UTF-8 for either database. PostgreSQL's JSON has no NaN nor
Infinity either, which Python's parser reads from the literals and from a number past the
float range (`1e999`). Any of them, anywhere in a request that is stored, fails its write
after the caller may have been served; so the request is refused before anything is done
with it."""

import math
import re
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ModelWrapValidatorHandler, ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError

_NUL = "must not contain NUL (0x00) characters"
_SURROGATE = "must not contain a lone surrogate (a \\ud800 to \\udfff escape without its pair)"
_NOT_FINITE = (
    "must be a finite number (NaN, Infinity and numbers past ±1.8e308, such as 1e999, "
    "cannot be stored)"
)
_UNSTORABLE = re.compile(r"[\x00\ud800-\udfff]")
# A hostile key is named in the error, escaped and cut to this many characters.
_KEY_SHOWN = 60


@dataclass(frozen=True)
class Unstorable:
    """Where the first unstorable text is (keys and list positions, from the top) and why."""

    location: tuple[str | int, ...]
    message: str


def unstorable_text(value: object) -> Unstorable | None:
    """The first string or number in `value`, or in the lists and dicts (keys too) it holds at
    any depth, that the database cannot store; None when all can be stored."""
    # Depth first, in the order the caller wrote them, and without recursion: a body nested
    # as deeply as the JSON parser allows is walked too.
    pending: list[tuple[tuple[str | int, ...], object]] = [((), value)]
    while pending:
        location, item = pending.pop()
        if isinstance(item, str):
            if (problem := _text_problem(item)) is not None:
                return Unstorable(location, problem)
        elif isinstance(item, float):
            if not math.isfinite(item):
                return Unstorable(location, _NOT_FINITE)
        elif isinstance(item, dict):
            children: list[tuple[tuple[str | int, ...], object]] = []
            for key, child in item.items():
                if isinstance(key, str) and (problem := _text_problem(key)) is not None:
                    return Unstorable((*location, _shown(key)), f"this key {problem}")
                children.append(((*location, key), child))
            pending.extend(reversed(children))
        elif isinstance(item, list | tuple):
            pending.extend(reversed([((*location, i), child) for i, child in enumerate(item)]))
    return None


def refuse_unstorable_text[M: BaseModel](
    cls: type[M], data: Any, handler: ModelWrapValidatorHandler[M]
) -> M:
    """A schema's `model_validator(mode="wrap")`: the whole input walked once, before any
    other validation, with the place of the first unstorable value as the error's location.
    Wrap, not before: it then sees the input as sent (django-ninja's schemas hand their before
    validators a getter instead)."""
    found = unstorable_text(data)
    if found is None:
        return handler(data)
    error = InitErrorDetails(
        type=PydanticCustomError("unstorable_text", found.message),
        loc=found.location,
        input="",  # not echoed: it is what cannot be stored
    )
    raise ValidationError.from_exception_data("unstorable text", [error])


def _text_problem(text: str) -> str | None:
    found = _UNSTORABLE.search(text)
    if found is None:
        return None
    return _NUL if found.group() == "\x00" else _SURROGATE


def _shown(key: str) -> str:
    escaped = key.encode("unicode_escape").decode("ascii")
    return escaped if len(escaped) <= _KEY_SHOWN else escaped[: _KEY_SHOWN - 1] + "…"


def storable(text: str) -> str:
    """A model's answer made storable: NUL dropped (no reader needs one), a lone surrogate
    made U+FFFD. An answer is not refused: the caller is owed it, and its log row too."""
    return _UNSTORABLE.sub(lambda found: "" if found.group() == "\x00" else "\ufffd", text)
