"""The map of the code stays whole: docs/architecture.md's "Project layout" gives one line to
each module of icrlhf/, so a newcomer finds every module there, what it is for, and its app. A
module added without its line fails here, naming it; so does a line left behind by a module
removed or moved, which would send a reader to a file that is not there."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CODE = ROOT / "icrlhf"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
SECTION = "## Project layout"

# A table row's first cell when it is one path in backticks (`review/guard.py`).
_FIRST_CELL = re.compile(r"^\|\s*`([^`]+)`\s*\|")


def modules() -> list[str]:
    """Every module of icrlhf/, relative to it: its `.py` files, management commands included,
    but not the `__init__.py` files (a package's line is its app's) nor the migrations
    (generated, and read as the models' history, not as code to find one's way in)."""
    return sorted(
        path.relative_to(CODE).as_posix()
        for path in CODE.rglob("*.py")
        if path.name != "__init__.py" and "migrations" not in path.relative_to(CODE).parts
    )


def mapped() -> list[str]:
    """The modules the section's table rows name in their first cell: the `.py` paths, so that
    the rows for folders outside icrlhf/ (`worker/`, `tests/`) are left to the prose."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    assert SECTION in text, f"{ARCHITECTURE.name} has no {SECTION!r} section"
    section = text.split(f"\n{SECTION}\n", 1)[1].split("\n## ", 1)[0]
    names = (_FIRST_CELL.match(line) for line in section.splitlines())
    return [name.group(1) for name in names if name and name.group(1).endswith(".py")]


def test_every_module_has_its_line_in_the_project_layout() -> None:
    missing = sorted(set(modules()) - set(mapped()))
    assert not missing, (
        f"These modules have no line in docs/architecture.md, {SECTION!r}: {missing}. Add one "
        "row each to its app's table, first cell its path relative to icrlhf/ in backticks "
        "(`review/guard.py`), second cell what it is for in one line."
    )


def test_every_line_of_the_project_layout_names_a_module_there_is() -> None:
    """Checked against the same rule as above: a line for an `__init__.py` or a migration
    would name a file that exists yet is not one of the modules the map keeps."""
    gone = sorted(set(mapped()) - set(modules()))
    assert not gone, (
        f"docs/architecture.md, {SECTION!r}, has lines for modules icrlhf/ does not have: "
        f"{gone}. Remove them, or correct the path (relative to icrlhf/) if the module moved."
    )
