"""JSON that an end user, a reviewer or a model wrote (a tool call's arguments, a tool's result,
a field's value), read and written back in one place.

Python's parser accepts what JSON has not (NaN, Infinity), and gives up on deep nesting with
a RecursionError whose depth depends on how deep the caller's own stack already is; what it
hands back may then be too deep for the code that walks it (json.dumps, comparisons,
templates). So such text is JSON here only when it is standard JSON nested at most MAX_DEPTH
levels: anything else is `NotJson`, and each caller treats it as the text it is."""

import json
import math
from typing import Any

from icrlhf.integrations.text_checks import unstorable_text

# Far beyond any tool's arguments or result, far below the parser's own limit (about 1,000
# levels, less inside a deep stack) and the recursion of what reads the value afterwards.
MAX_DEPTH = 100


class NotJson(ValueError):
    """The text is not standard JSON, or nests deeper than MAX_DEPTH levels."""


def loads(text: object) -> Any:
    """The value `text` holds as JSON, or NotJson (whatever the parser raised)."""
    if not isinstance(text, str):
        raise NotJson("not a text")
    try:
        value = json.loads(text, parse_constant=_not_a_number, parse_float=_finite)
    except RecursionError:
        raise NotJson(f"nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as error:  # the parser's JSONDecodeError, and NaN or Infinity
        raise NotJson(str(error)) from None
    # Each level opens a bracket: a text with no more brackets than the levels allowed
    # (counted at C speed) is not walked.
    brackets = text.count("[") + text.count("{")
    if brackets > MAX_DEPTH and _deeper_than(value, MAX_DEPTH):
        raise NotJson(f"nested deeper than {MAX_DEPTH} levels")
    return value


def dumps(value: Any, *, indent: int | None = None) -> str:
    """`value` (what `loads` returned, or holds) as JSON text that both databases store and a
    page or a download can send: non-ASCII characters as they are, unless a lone surrogate is
    among them (what `loads` makes of a "\\ud800" escape without its pair), which UTF-8 cannot
    encode: then every one is an escape again."""
    text = json.dumps(value, ensure_ascii=False, indent=indent, allow_nan=False)
    if unstorable_text(text) is not None:
        return json.dumps(value, indent=indent, allow_nan=False)  # ASCII only
    return text


def _not_a_number(constant: str) -> Any:
    raise ValueError(f"{constant} is not a JSON number")


def _finite(number: str) -> float:
    """A number past the float range (1e999) reads as infinity, which JSON cannot write back
    and PostgreSQL's JSON refuses: not a JSON number here either."""
    value = float(number)
    if not math.isfinite(value):
        raise ValueError(f"{number[:20]} is past the range of a number")
    return value


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether the lists and dicts in `value` nest more than `limit` levels (walked without
    recursion)."""
    pending: list[tuple[Any, int]] = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, dict):
            item = list(item.values())
        if isinstance(item, list):
            if depth > limit:
                return True
            pending.extend((child, depth + 1) for child in item)
    return False
