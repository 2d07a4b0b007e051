"""What an entry may say. Its text reaches every prompt of its queue and every reviewer's
page, and may come from a reflection (an LLM's answer, untrusted): it is plain text, with no
markup or links, and never asks the model to give away what it is shown."""

import re

from icrlhf.playbook.models import ENTRY_MAX_CHARS, SECTION_MAX_CHARS

_MARKUP = (
    (re.compile(r"<\s*/?\s*[a-zA-Z!][^>]*>"), "it holds markup (an HTML tag)"),
    (re.compile(r"&(#\d+|#x[0-9a-fA-F]+|[a-zA-Z]+);"), "it holds markup (an HTML entity)"),
    (re.compile(r"!?\[[^\]]*\]\([^)]*\)"), "it holds a link"),
    (re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://|\bwww\.", re.IGNORECASE), "it holds a link"),
    (re.compile(r"\b(javascript|data|mailto):", re.IGNORECASE), "it holds a link"),
    # A bare domain: a model would pass it on as a link.
    (
        re.compile(
            r"\b[a-z0-9-]+(\.[a-z0-9-]+)*\.(com|org|net|io|dev|app|co|uk|de|fr|info|biz|ly|me|xyz)\b",
            re.IGNORECASE,
        ),
        "it holds a link",
    ),
)
# An instruction to hand over what the prompt holds: other customers' words (the examples),
# the memory, or the prompt itself.
_WHAT_IS_SHOWN = (
    r"((stored|retrieved|past|previous|earlier|other|your|the|these) examples|memory|memories|"
    r"stored answers|(past|previous|earlier) (answers|conversations|tickets)|"
    r"other (customers?|users?|people|conversations|tickets)|system prompt|"
    r"(your|the system|these|this) (prompt|instructions)|playbook|training data)"
)
_REVEALING = (
    re.compile(
        r"\b(reveal|disclose|leak|print|repeat|recite|dump|output|quote|copy|paste|share|show|"
        r"list)\b[^.;:!?\n]{0,60}?\b" + _WHAT_IS_SHOWN + r"\b",
        re.IGNORECASE,
    ),
    re.compile(
        r"\b(ignore|disregard|forget|override)\b[^.;:!?\n]{0,30}?\b"
        r"(previous|prior|above|earlier|all|other|your)\b[^.;:!?\n]{0,20}?\b"
        r"(instructions|rules|guidelines|entries|prompt)\b",
        re.IGNORECASE,
    ),
)


def entry_problem(*, section: str, text: str) -> str | None:
    """Why the entry cannot stand, in words for the person or the log; None when it can."""
    if not text.strip():
        return "its text is empty"
    if not section.strip():
        return "its section is empty"
    if len(text) > ENTRY_MAX_CHARS:
        return f"its text has {len(text):,} characters; the limit is {ENTRY_MAX_CHARS}"
    if len(section) > SECTION_MAX_CHARS:
        return f"its section has {len(section):,} characters; the limit is {SECTION_MAX_CHARS}"
    for field in (section, text):
        for pattern, problem in _MARKUP:
            if pattern.search(field):
                return f"{problem}: an entry is plain text"
        if any(pattern.search(field) for pattern in _REVEALING):
            return (
                "it asks the model to reveal or set aside what its prompt holds (the examples, "
                "the memory or the instructions)"
            )
    return None
