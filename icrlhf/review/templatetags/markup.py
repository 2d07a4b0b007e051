"""LLM output and guidelines as markdown, sanitised: the model's text is untrusted."""

import markdown as markdown_lib
import nh3
from django import template
from django.utils.safestring import SafeString, mark_safe

register = template.Library()

# Ammonia's safe defaults, without images: a remote image in a candidate would leak the
# reviewer's address to whoever the model (or a prompt injection) pointed at.
_ALLOWED_TAGS = nh3.ALLOWED_TAGS - {"img"}


@register.filter
def markdown_safe(text: str) -> SafeString:
    html = markdown_lib.markdown(text or "", extensions=["fenced_code", "tables", "sane_lists"])
    return mark_safe(nh3.clean(html, tags=_ALLOWED_TAGS, link_rel="noopener noreferrer nofollow"))  # noqa: S308 (sanitised just above)
