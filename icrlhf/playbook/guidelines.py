"""Guidelines written before playbooks, as entries: a markdown heading names the section of
what follows it, and each list item or paragraph is one entry."""

import re

DEFAULT_SECTION = "Guidelines"
_HEADING = re.compile(r"^\s{0,3}#{1,6}\s+(?P<title>.+?)\s*#*\s*$")
_LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+(?P<text>.*)$")


def guidelines_entries(markdown: str) -> list[tuple[str, str]]:
    """(section, text) for each entry, in the text's order."""
    entries: list[tuple[str, str]] = []
    section = DEFAULT_SECTION
    lines: list[str] = []

    def close() -> None:
        text = " ".join(" ".join(lines).split())
        if text:
            entries.append((section[:80], text))
        lines.clear()

    for line in markdown.splitlines():
        heading = _HEADING.match(line)
        item = _LIST_ITEM.match(line)
        if heading is not None:
            close()
            section = heading.group("title").strip() or DEFAULT_SECTION
        elif item is not None:
            close()
            lines.append(item.group("text"))
        elif not line.strip():
            close()
        else:
            lines.append(line)
    close()
    return entries
