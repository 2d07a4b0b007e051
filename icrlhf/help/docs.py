"""The user-facing pages of the repository's docs/ folder, one help page each, rendered with
Markdown, in reading order. A link to another of these pages (`api.md#the-decision-webhook`)
goes to that help page; a link to a file the help does not render (the benchmarks, the
changelog, the README) and a figure are named, not shown. An install without docs/ (the wheel
ships without it; the image has it) has no pages."""

import functools
import posixpath
import re
from dataclasses import dataclass
from pathlib import Path

import markdown
from django.conf import settings
from django.urls import reverse
from django.utils.html import escape
from markdown.extensions.toc import slugify

# The help's pages, in reading order: docs/README.md's list, without the developer's guide
# (for those who change the code, in the repository), the benchmarks (figures of one machine,
# not help) and the index itself.
PAGES = (
    "reviewers.md",
    "apps-and-agents.md",
    "api.md",
    "exports.md",
    "operators.md",
    "architecture.md",
)

_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_IMAGE = re.compile(r"!\[([^\]]*)\]\(([^)\s]+)[^)]*\)")
_IMG_TAG = re.compile(r"<img\b[^>]*>", re.IGNORECASE)
_ATTRIBUTE = re.compile(r'\b(src|alt)="([^"]*)"', re.IGNORECASE)
_LINK = re.compile(r'<a href="([^"]*)"([^>]*)>(.*?)</a>', re.DOTALL)
_EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:|^//", re.IGNORECASE)


@dataclass(frozen=True)
class HelpPage:
    slug: str  # the file's name without `.md`: /help/<slug>/
    title: str  # its `#` heading
    subtitles: tuple[tuple[str, str], ...]  # (anchor, title) of its `##` headings
    anchors: frozenset[str]  # every heading's anchor, its title's included
    html: str


def docs_path() -> Path:
    return Path(settings.BASE_DIR) / "docs"


def help_pages(*, folder: Path | None = None) -> list[HelpPage]:
    """The help's pages, in reading order: those of PAGES that the install's docs/ has."""
    folder = folder or docs_path()
    stamps = []
    for name in PAGES:
        try:
            stamps.append((name, (folder / name).stat().st_mtime_ns))
        except FileNotFoundError:
            continue
    return list(_pages(folder, tuple(stamps)))


def page_for_anchor(anchor: str, pages: list[HelpPage]) -> HelpPage | None:
    """The first page with a heading of that anchor: where a link to an old help page (one of
    the README's sections, before docs/) now leads."""
    return next((page for page in pages if anchor in page.anchors), None)


@functools.lru_cache(maxsize=4)
def _pages(folder: Path, stamps: tuple[tuple[str, int], ...]) -> tuple[HelpPage, ...]:
    """Parsed once per version of the files (`stamps` holds their modification times)."""
    slugs = {name: name.removesuffix(".md") for name, _stamp in stamps}
    pages = []
    for name, _stamp in stamps:
        title, body = _title(folder.joinpath(name).read_text(encoding="utf-8"), slugs[name])
        headings = _headings(body)
        pages.append(
            HelpPage(
                slug=slugs[name],
                title=title,
                subtitles=tuple((a, t) for a, t, level in headings if level == 2),
                anchors=frozenset([slugify(title, "-"), *(a for a, _t, _level in headings)]),
                html=_links(_render(body), slugs),
            )
        )
    return tuple(pages)


def _title(text: str, slug: str) -> tuple[str, str]:
    """The page's `#` heading (the template shows it) and the rest of its text."""
    lines = text.splitlines()
    for index, line in enumerate(lines):
        if line.startswith("# "):
            return line[2:].strip(), "\n".join(lines[index + 1 :]).strip()
        if line.strip():
            break
    return slug.replace("-", " ").capitalize(), text.strip()


def _headings(text: str) -> list[tuple[str, str, int]]:
    found, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced and (match := _HEADING.match(line)):
            title = re.sub(r"[`*_]", "", match.group(2))
            found.append((slugify(title, "-"), title, len(match.group(1))))
    return found


def _in_repository(path: str) -> str:
    """A path relative to docs/, as the repository names it (`../CHANGELOG.md`: CHANGELOG.md)."""
    return posixpath.normpath(posixpath.join("docs", path))


def _figure(alt: str, src: str) -> str:
    return f"*(Figure: {alt}, `{_in_repository(src)}` in the repository.)*"


def _img_tag(match: re.Match[str]) -> str:
    attributes = {k.lower(): v for k, v in _ATTRIBUTE.findall(match.group(0))}
    return _figure(attributes.get("alt", ""), attributes.get("src", ""))


def _render(text: str) -> str:
    text = _IMAGE.sub(lambda m: _figure(m.group(1), m.group(2)), text)
    text = _IMG_TAG.sub(_img_tag, text)
    return str(markdown.markdown(text, extensions=["fenced_code", "tables", "toc", "sane_lists"]))


def _links(html: str, slugs: dict[str, str]) -> str:
    """Links to the other help pages lead there; links to files the help does not render are
    named instead (a help page cannot open them)."""

    def link(match: re.Match[str]) -> str:
        href, attributes, text = match.groups()
        if href.startswith("#") or _EXTERNAL.match(href):
            return match.group(0)
        path, _hash, fragment = href.partition("#")
        if path in slugs:
            url = reverse("help:page", args=[slugs[path]]) + (f"#{fragment}" if fragment else "")
            return f'<a href="{escape(url)}"{attributes}>{text}</a>'
        named = escape(_in_repository(path))
        if re.sub(r"<[^>]+>", "", text).strip() in {path, posixpath.basename(path), named}:
            return f"<code>{named}</code> (in the repository)"
        return f"{text} (<code>{named}</code> in the repository)"

    return _LINK.sub(link, html)
