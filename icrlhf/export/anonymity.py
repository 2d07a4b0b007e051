"""What an export does with end users' words and identities, one path for every export
(decisions, agent runs). Their words always pass the one redaction (`scrub`: REDACTION
decides, as for everything that leaves the call log); anonymised, they are redacted whatever
REDACTION says, and an identity (a reviewer's name, an item's customer, an application's id
for an item or a run, a user message's `name`) is left out (null)."""

from typing import Any, cast

from icrlhf.integrations.redaction import redact_json, scrub

Message = dict[str, Any]


def identity(value: str | None, *, anonymize: bool) -> str | None:
    return None if anonymize else value


def _words[T](value: T, *, anonymize: bool) -> T:
    return cast(T, redact_json(value)) if anonymize else scrub(value, into="review")


def text(value: str, *, anonymize: bool) -> str:
    return _words(value, anonymize=anonymize)


def messages(value: list[Message], *, anonymize: bool) -> list[Message]:
    """Chat messages; a user message's `name` (OpenAI's participant name) is an end user's
    identity, so it is left out."""
    if anonymize:
        value = [
            {k: v for k, v in m.items() if not (k == "name" and m.get("role") == "user")}
            for m in value
        ]
    return _words(value, anonymize=anonymize)


def action(value: dict[str, Any], *, anonymize: bool) -> dict[str, Any]:
    """An action in OpenAI's shape: {"content": ..., "tool_calls": [...]}."""
    return _words(value, anonymize=anonymize)


def tool_calls(value: list[dict[str, Any]], *, anonymize: bool) -> list[dict[str, Any]]:
    return _words(value, anonymize=anonymize)


def fields(value: dict[str, Any] | None, *, anonymize: bool) -> dict[str, Any] | None:
    """A structured answer's fields (a triage's category, priority and reply)."""
    return _words(value, anonymize=anonymize)
