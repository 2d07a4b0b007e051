"""Django's {# #} comments end at the line's end: one spanning lines is printed on the page
(inside a tag, it becomes attributes). Multi-line comments use {% comment %}."""

from pathlib import Path

TEMPLATES = Path(__file__).resolve().parents[1] / "templates"


def test_no_template_comment_spans_lines() -> None:
    spanning = [
        f"{path.relative_to(TEMPLATES)}:{number}"
        for path in sorted(TEMPLATES.rglob("*.html"))
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if "{#" in line and "#}" not in line.split("{#", 1)[1]
    ]
    assert spanning == []
