"""The README split at its `##` headings, one help page each, rendered with Markdown. A link
to a heading of another page goes to that page; figures (files of the repository's docs/
folder, which an install may not have) are named, not shown."""

import functools
import re
from dataclasses import dataclass
from pathlib import Path

import markdown
from django.conf import settings
from django.urls import reverse
from markdown.extensions.toc import slugify

OVERVIEW = "Overview"
_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^(#{2,6})\s+(.*?)\s*#*\s*$")
_IMAGE = re.compile(r"!\[([^\]]*)\]\(([^)\s]+)[^)]*\)")
_ANCHOR_LINK = re.compile(r'href="#([^"]+)"')


@dataclass(frozen=True)
class HelpSection:
    slug: str
    title: str
    subtitles: tuple[tuple[str, str], ...]  # (anchor, title) of its `###` headings
    html: str


def readme_path() -> Path:
    return Path(settings.BASE_DIR) / "README.md"


def help_sections(*, path: Path | None = None) -> list[HelpSection]:
    """The README's sections, in order (none if the install has no README)."""
    path = path or readme_path()
    try:
        stamp = path.stat().st_mtime_ns
    except FileNotFoundError:
        return []
    return list(_sections(path, stamp))


@functools.lru_cache(maxsize=4)
def _sections(path: Path, stamp: int) -> tuple[HelpSection, ...]:
    """Parsed once per version of the file (`stamp` is its modification time)."""
    parts = _split(path.read_text(encoding="utf-8"))
    # Which page holds each heading, for links between pages.
    owner: dict[str, str] = {}
    for slug, _title, text in parts:
        owner[slug] = slug
        for anchor, _subtitle, _level in _headings(text):
            owner.setdefault(anchor, slug)
    sections = []
    for slug, title, text in parts:
        html = _render(text)

        def link(match: re.Match[str], here: str = slug) -> str:
            anchor = match.group(1)
            page = owner.get(anchor)
            if page is None or page == here:
                return match.group(0)
            fragment = "" if anchor == page else f"#{anchor}"
            return f'href="{reverse("help:section", args=[page])}{fragment}"'

        subtitles = tuple((a, t) for a, t, level in _headings(text) if level == 2)
        sections.append(HelpSection(slug, title, subtitles, _ANCHOR_LINK.sub(link, html)))
    return tuple(sections)


def _split(readme: str) -> list[tuple[str, str, str]]:
    """(slug, title, markdown) per `##` section, its headings one level up; what comes before
    the first is the overview (its `#` title, the project's name, left out)."""
    parts: list[tuple[str, list[str]]] = [(OVERVIEW, [])]
    fenced = False
    for line in readme.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
        if not fenced and line.startswith("## "):
            parts.append((line[3:].strip(), []))
        elif not fenced and line.startswith("###"):
            parts[-1][1].append(line[1:])  # one level up: the page's title is its only h1
        elif not (not fenced and line.startswith("# ") and len(parts) == 1):
            parts[-1][1].append(line)
    return [
        (slugify(title, "-"), title, "\n".join(lines).strip())
        for title, lines in parts
        if title != OVERVIEW or any(line.strip() for line in lines)
    ]


def _headings(text: str) -> list[tuple[str, str, int]]:
    found, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced and (match := _HEADING.match(line)):
            title = re.sub(r"[`*_]", "", match.group(2))
            found.append((slugify(title, "-"), title, len(match.group(1))))
    return found


def _render(text: str) -> str:
    text = _IMAGE.sub(
        lambda m: f"*(Figure: {m.group(1)}, `{m.group(2)}` in the repository.)*", text
    )
    return str(markdown.markdown(text, extensions=["fenced_code", "tables", "toc", "sane_lists"]))
