"""Triage results: what a model proposes and a reviewer confirms (category, priority, reply).

Parsing is tolerant of how models format their answers: a JSON object (bare, in a code fence,
with prose around it, with single quotes or trailing commas) or "Key: value" lines. Anything
that still does not fit the queue's categories is reported, never guessed at wildly."""

import contextlib
import difflib
import json
import re
from dataclasses import dataclass

from icrlhf.integrations import untrusted_json
from icrlhf.queues.models import Item, Queue

PRIORITIES: tuple[str, ...] = tuple(Item.Priority.values)
_PRIORITY_SYNONYMS = {
    "medium": "normal",
    "moderate": "normal",
    "standard": "normal",
    "critical": "urgent",
    "highest": "urgent",
    "emergency": "urgent",
    "lowest": "low",
    "minor": "low",
}
MAX_REPLY_CHARS = 5_000


class TriageParseError(ValueError):
    pass


@dataclass(frozen=True)
class TriageFields:
    category: str
    priority: str
    reply: str

    def as_dict(self) -> dict[str, str]:
        return {"category": self.category, "priority": self.priority, "reply": self.reply}

    def as_text(self) -> str:
        return fields_text(self.as_dict())


def fields_text(fields: dict[str, str]) -> str:
    """The canonical form triage examples carry into later prompts."""
    ordered = {key: fields.get(key, "") for key in ("category", "priority", "reply")}
    return json.dumps(ordered, ensure_ascii=False)


def _slug(value: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", value.strip().strip("\"'`").lower()).strip("_")


def category_match(value: str, categories: list[str]) -> str:
    if not categories:
        raise TriageParseError("This queue has no categories configured.")
    by_slug = {_slug(c): c for c in categories}
    wanted = _slug(value)
    if not wanted:
        raise TriageParseError("No category was given.")
    if wanted in by_slug:
        return by_slug[wanted]
    close = difflib.get_close_matches(wanted, list(by_slug), n=2, cutoff=0.88)
    if len(close) == 1:
        return by_slug[close[0]]
    raise TriageParseError(f"“{value.strip()[:80]}” is not one of the queue's categories.")


def priority_match(value: str) -> str:
    wanted = _slug(value) or "normal"
    wanted = _PRIORITY_SYNONYMS.get(wanted, wanted)
    if wanted not in PRIORITIES:
        raise TriageParseError(
            f"“{value.strip()[:40]}” is not a priority ({', '.join(PRIORITIES)})."
        )
    return wanted


def fields_validate(
    *, category: str, priority: str, reply: str, categories: list[str]
) -> TriageFields:
    reply = reply.strip()
    if len(reply) > MAX_REPLY_CHARS:
        raise TriageParseError(f"The reply is longer than {MAX_REPLY_CHARS:,} characters.")
    return TriageFields(category_match(category, categories), priority_match(priority), reply)


def _json_object(text: str) -> dict[str, object] | None:
    start, end = text.find("{"), text.rfind("}")
    if start < 0:
        return None
    raw = text[start : end + 1] if end > start else ""
    attempts = [raw, re.sub(r",\s*([}\]])", r"\1", raw.replace("'", '"'))] if raw else []
    # An answer cut at the token limit inside its reply: closed here, the reply as far as it got.
    attempts += [text[start:] + '"}', text[start:] + "}"]
    for attempt in attempts:
        try:
            value = untrusted_json.loads(attempt)
        except untrusted_json.NotJson:  # a model's answer is untrusted
            continue
        if isinstance(value, dict):
            return {str(k).strip().lower(): v for k, v in value.items()}
    return None


# A key, bare or quoted (a JSON object cut off before its closing brace reads as lines).
_KEY_VALUE = re.compile(
    r"[\"']?(category|priority|reply|response|answer)[\"']?[\s*]*[:=](.*)", re.I
)


def _unquoted(value: str) -> str:
    """A JSON-ish value as written on its line: without its trailing comma and quotes."""
    return value.strip().removesuffix(",").strip().strip("\"'")


def _key_value_lines(text: str) -> dict[str, object]:
    found: dict[str, object] = {}
    reply_lines: list[str] = []
    in_reply = False
    for line in text.splitlines():
        # Markdown's bullets and emphasis stripped first: one pattern with no two adjacent
        # open-ended runs, so a line of 50,000 spaces costs linear time, not quadratic.
        match = _KEY_VALUE.match(line.lstrip(" \t*#>-"))
        if match:
            key, value = match.group(1).lower(), _unquoted(match.group(2))
            key = "reply" if key in {"response", "answer"} else key
            in_reply = key == "reply"
            if in_reply:
                reply_lines = [value]
            else:
                found[key] = value
        elif in_reply:
            reply_lines.append(line)
    if reply_lines:
        found["reply"] = "\n".join(reply_lines).strip()
    return found


def triage_parse(text: str, categories: list[str]) -> TriageFields:
    """The triage fields in a model's answer; TriageParseError says why there are none."""
    data = _json_object(text) or _key_value_lines(text)
    if "category" not in data:
        raise TriageParseError("The answer names no category.")
    reply = data.get("reply", data.get("response", ""))
    return fields_validate(
        category=str(data.get("category") or ""),
        priority=str(data.get("priority") or "normal"),
        reply=str(reply or ""),
        categories=categories,
    )


def triage_partial(text: str, categories: list[str]) -> dict[str, str]:
    """What can be read from an answer that does not parse as a whole: the fields that fit,
    and as its reply the reply it gave, else its whole raw text (a start for the reviewer)."""
    data = _json_object(text) or _key_value_lines(text)
    found = {"category": "", "priority": "", "reply": ""}
    for key, match in (
        ("category", lambda value: category_match(value, categories)),
        ("priority", priority_match),
    ):
        if data.get(key):
            with contextlib.suppress(TriageParseError):  # a field that does not fit stays empty
                found[key] = match(str(data[key]))
    reply = data.get("reply") or data.get("response")
    found["reply"] = (str(reply) if reply else text).strip()[:MAX_REPLY_CHARS]
    return found


# A reply is asked to be short; the schema bounds it so a small model cannot ramble on (or
# stop at a single word) inside the JSON, and so the whole answer fits the queue's max tokens
# (cut there, the JSON would never close): two characters a token at worst (the local model
# wrote replies of odd words and escapes that ran past three), 50 tokens for the rest.
REPLY_MIN_CHARS, REPLY_MAX_CHARS = 20, 600


def _reply_max_chars(max_tokens: int) -> int:
    return max(REPLY_MIN_CHARS, min(REPLY_MAX_CHARS, (max_tokens - 50) * 2))


def triage_schema(queue: Queue) -> dict[str, object]:
    """The JSON schema of a triage answer: the queue's categories and the priorities as
    enums, and a reply of sensible length."""
    return {
        "type": "object",
        "properties": {
            "category": {"type": "string", "enum": list(queue.categories)},
            "priority": {"type": "string", "enum": list(PRIORITIES)},
            "reply": {
                "type": "string",
                "minLength": REPLY_MIN_CHARS,
                "maxLength": _reply_max_chars(queue.max_tokens),
            },
        },
        "required": ["category", "priority", "reply"],
        "additionalProperties": False,
    }


def triage_instructions(categories: list[str]) -> str:
    """What a triage queue's system prompt adds: the labels and the answer format."""
    return (
        "Triage the customer's ticket. Choose exactly one category from this list: "
        + ", ".join(categories)
        + f". Choose a priority: {', '.join(PRIORITIES[:-1])} or {PRIORITIES[-1]}. "
        "Write a short reply to the customer. "
        'Answer with JSON only: {"category": "...", "priority": "...", "reply": "..."}'
    )
