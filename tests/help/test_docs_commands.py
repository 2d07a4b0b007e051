"""Every command the README and docs/ show exists: each `manage.py <command>` is one of
Django's management commands, each `--flag` shown after it is one its parser takes, and each
`make <target>` is a target of the Makefile. A renamed command or flag fails here, naming the
page, rather than in a reader's terminal."""

import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from django.core.management import get_commands, load_command_class

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_FENCE = re.compile(r"^\s*(```|~~~)")
_CODE_SPAN = re.compile(r"`([^`]+)`")
_MANAGE = re.compile(r"\bmanage\.py\s+([a-z_][a-z0-9_]*\*?)")
_MAKE = re.compile(r"(?:^|[\s;&|(])make\s+([a-z][a-z0-9_-]*)")
_FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")
# A shell comment ends a command (`make chaos  # or: manage.py chaos …` is two).
_COMMENT = re.compile(r"\s#\s")


@dataclass(frozen=True)
class Shown:
    document: str
    code: str  # the command as the page shows it


def _code(document: Path) -> Iterator[str]:
    """The page's code: each command of its fenced blocks (a line, with the indented `[--flag]`
    lines that continue it) and each of its inline code spans."""
    prose: list[str] = []
    block: list[str] = []
    fenced = False
    for line in document.read_text(encoding="utf-8").splitlines():
        if _FENCE.match(line):
            if fenced:
                yield from _commands(block)
                block = []
            fenced = not fenced
        elif fenced:
            block.append(line)
        else:
            prose.append(line)
    for match in _CODE_SPAN.finditer("\n".join(prose)):
        yield " ".join(match.group(1).split())


def _commands(lines: list[str]) -> Iterator[str]:
    command = ""
    for line in lines:
        stripped = line.strip()
        continued = line[:1].isspace() and stripped.startswith(("[", "--"))
        if command and (continued or command.endswith("\\")):
            command = f"{command.rstrip(chr(92))} {stripped}"
            continue
        if command:
            yield command
        command = stripped
    if command:
        yield command


def _pieces(code: str) -> Iterator[str]:
    for piece in _COMMENT.split(code):
        yield from piece.split("&&")


def shown() -> list[Shown]:
    return [Shown(document.name, code) for document in DOCUMENTS for code in _code(document)]


def manage_commands() -> list[tuple[Shown, str, list[str]]]:
    """(where, command, the flags shown after it) for each `manage.py <command>`, and for a
    code span that begins with a command's own name and a flag (`bench_triage --json`)."""
    found = []
    for where in shown():
        for piece in _pieces(where.code):
            match = _MANAGE.search(piece)
            if match:
                name, rest = match.group(1), piece[match.end() :]
            else:
                words = piece.split(maxsplit=1)
                if len(words) < 2 or words[0] not in get_commands() or "--" not in words[1]:
                    continue
                name, rest = words[0], words[1]
            found.append((where, name, _FLAG.findall(rest)))
    return found


def make_targets_shown() -> list[tuple[Shown, str]]:
    return [
        (where, target)
        for where in shown()
        for piece in _pieces(where.code)
        for target in _MAKE.findall(piece)
    ]


@cache
def makefile_targets() -> frozenset[str]:
    targets: set[str] = set()
    for line in (ROOT / "Makefile").read_text(encoding="utf-8").splitlines():
        match = re.match(r"^([A-Za-z0-9_.][A-Za-z0-9_. -]*?)\s*:(?![=:])", line)
        if match:
            targets.update(match.group(1).split())
    return frozenset(targets)


@cache
def flags_of(name: str) -> frozenset[str]:
    command = load_command_class(get_commands()[name], name)
    parser = command.create_parser("manage.py", name)
    return frozenset(parser._option_string_actions)


def test_the_pages_show_commands_to_check() -> None:
    """The extraction finds what the pages show (were it to find nothing, the tests below
    would pass on anything)."""
    names = {name for _where, name, _flags in manage_commands()}
    assert {"bench_pipeline", "chaos", "export_preferences", "create_api_token"} <= names
    assert {"run", "test", "test-fast", "bench", "chaos"} <= {t for _w, t in make_targets_shown()}
    flags = {(name, flag) for _w, name, shown_flags in manage_commands() for flag in shown_flags}
    assert ("bench_gateway", "--recall-timeout") in flags  # a continued line of a code block
    assert ("export_preferences", "--since-last-export") in flags  # a code span over two lines


def exists(name: str) -> bool:
    """A command, or a family of them (`manage.py bench_*`)."""
    if name.endswith("*"):
        return any(command.startswith(name[:-1]) for command in get_commands())
    return name in get_commands()


def test_every_manage_py_command_shown_exists() -> None:
    missing = sorted(
        {
            f"{where.document}: manage.py {name}"
            for where, name, _flags in manage_commands()
            if not exists(name)
        }
    )
    assert missing == []


def test_every_flag_shown_after_a_command_is_one_it_takes() -> None:
    unknown = sorted(
        {
            f"{where.document}: manage.py {name} {flag}"
            for where, name, flags in manage_commands()
            if name in get_commands()
            for flag in flags
            if flag not in flags_of(name)
        }
    )
    assert unknown == []


def test_every_make_target_shown_exists() -> None:
    missing = sorted(
        {
            f"{where.document}: make {target}"
            for where, target in make_targets_shown()
            if target not in makefile_targets()
        }
    )
    assert missing == []
