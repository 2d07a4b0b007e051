"""LLM output and guidelines as markdown, sanitised: the model's text is untrusted."""

import difflib
import re
from functools import lru_cache

import markdown as markdown_lib
import nh3
from django import template
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

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


@register.filter
def word_diff(original: str, final: str) -> SafeString:
    """The words an edit removed (<del>) and added (<ins>), escaped; LLM text is untrusted."""
    before, after = re.split(r"(\s+)", original or ""), re.split(r"(\s+)", final or "")
    parts: list[str] = []
    matcher = difflib.SequenceMatcher(a=before, b=after, autojunk=False)
    for operation, a_start, a_end, b_start, b_end in matcher.get_opcodes():
        removed, added = "".join(before[a_start:a_end]), "".join(after[b_start:b_end])
        if operation == "equal":
            parts.append(escape(removed))
            continue
        if removed:
            parts.append(f"<del>{escape(removed)}</del>")
        if added:
            parts.append(f"<ins>{escape(added)}</ins>")
    return mark_safe("".join(parts))  # noqa: S308 (every piece escaped)
