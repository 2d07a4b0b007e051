"""LLM output as markdown, sanitised: the model's text is untrusted."""

import difflib
import re
from functools import lru_cache

import markdown as markdown_lib
import nh3
from django import template
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from icrlhf.integrations import untrusted_json
from icrlhf.integrations.text_checks import storable

register = template.Library()

# Ammonia's safe defaults, without images: a remote image in a candidate would leak the
# reviewer's address to whoever the model (or a prompt injection) pointed at.
_ALLOWED_TAGS = nh3.ALLOWED_TAGS - {"img"}


@register.filter
def markdown_safe(text: str) -> SafeString:
    return mark_safe(_render(text or ""))  # noqa: S308 (sanitised by nh3 in _render)


# A candidate's text never changes once generated, and the review page is reloaded often:
# render each text once per process.
@lru_cache(maxsize=4096)
def _render(text: str) -> str:
    html = markdown_lib.markdown(text, extensions=["fenced_code", "tables", "sane_lists"])
    return nh3.clean(html, tags=_ALLOWED_TAGS, link_rel="noopener noreferrer nofollow ugc")


# Above this many characters (both texts together) the item page shows no word diff: the
# comparison's cost grows with the product of the lengths, and it ran on every view.
WORD_DIFF_MAX_CHARS = 12_000


@register.filter
def word_diff(original: str, final: str) -> SafeString:
    """The words an edit removed (<del>) and added (<ins>), escaped; LLM text is untrusted.
    Changes separated only by spaces or one unchanged word are one change, so that a rewrite
    reads as a rewrite (static/js/review.js groups the live diff the same way). Computed once
    per pair of texts (a decision's never change), and not at all above WORD_DIFF_MAX_CHARS."""
    original, final = original or "", final or ""
    size = len(original) + len(final)
    if size > WORD_DIFF_MAX_CHARS:
        return mark_safe(  # noqa: S308 (no text of anyone's in it)
            f'<span class="muted">Too long to compare word by word ({size:,} characters); '
            "the final text is shown above.</span>"
        )
    return mark_safe(_word_diff(original, final))  # noqa: S308 (every piece escaped)


@lru_cache(maxsize=1024)
def _word_diff(original: str, final: str) -> str:
    before, after = re.split(r"(\s+)", original), re.split(r"(\s+)", final)
    matcher = difflib.SequenceMatcher(a=before, b=after, autojunk=False)
    runs = [  # (unchanged?, removed, added)
        (operation == "equal", "".join(before[a_start:a_end]), "".join(after[b_start:b_end]))
        for operation, a_start, a_end, b_start, b_end in matcher.get_opcodes()
    ]
    parts: list[str] = []
    removed = added = ""
    for index, (unchanged, old, new) in enumerate(runs):
        between_changes = 0 < index < len(runs) - 1 and removed + added != ""
        if unchanged and not (between_changes and len(old.split()) <= 1):
            parts.append(_changed(removed, added) + escape(old))
            removed = added = ""
            continue
        removed, added = removed + old, added + new
    parts.append(_changed(removed, added))
    return "".join(parts)


def _changed(removed: str, added: str) -> str:
    return (f"<del>{escape(removed)}</del>" if removed else "") + (
        f"<ins>{escape(added)}</ins>" if added else ""
    )


@register.filter
def json_pretty(text: str) -> str:
    """A tool call's arguments, indented when they are JSON (left as sent when not: a model
    may write broken JSON, and the reviewer should see it as it is). Escaped by the template."""
    try:
        return untrusted_json.dumps(untrusted_json.loads(text), indent=2)
    except untrusted_json.NotJson:
        return text or ""


@register.filter
def json_fields(text: str) -> list[tuple[str, str]] | None:
    """A tool call's arguments as (name, value) pairs, each value as JSON writes it, when they
    are a JSON object: one short line per argument. None when they are not (shown as sent)."""
    try:
        arguments = untrusted_json.loads(text)
    except untrusted_json.NotJson:
        return None
    if not isinstance(arguments, dict):
        return None
    # A name is shown, not stored: a lone surrogate in it (which the page cannot encode) is
    # shown as U+FFFD.
    return [(storable(str(name)), untrusted_json.dumps(value)) for name, value in arguments.items()]
