"""The reflector's answer, read as mutations: untrusted text, so each one is checked, and a
refused one is dropped with the reason."""

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from icrlhf.playbook.checks import entry_problem
from icrlhf.reflection.prompts import MUTATIONS_MAX

_ENTRY_NAME = re.compile(r"^\s*E(\d+)\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class MutationDraft:
    op: str
    key: int | None
    section: str
    text: str
    cites: list[int]
    why: str


def mutations_read(
    text: str, *, shown: Sequence[int], entries: Mapping[int, tuple[str, str]]
) -> tuple[list[MutationDraft], list[str]]:
    """The mutations the answer proposes that can stand, and why each other was refused.
    `shown`: the ids of the decisions the reflector was shown, in the order it numbered them
    from 1 (its citations are those numbers; a mutation's are the ids); `entries`: the
    playbook in force, by key ((section, text))."""
    try:
        answer = json.loads(text)
    except json.JSONDecodeError:
        return [], [f"the answer is not JSON (it begins {' '.join(text.split())[:80]!r})"]
    rows = answer.get("mutations") if isinstance(answer, dict) else None
    if not isinstance(rows, list):
        return [], ['the answer has no list of "mutations"']
    kept: list[MutationDraft] = []
    refused: list[str] = []
    for number, row in enumerate(rows[:MUTATIONS_MAX], start=1):
        draft, problem = _mutation(row, shown=shown, entries=entries)
        if draft is None:
            refused.append(f"change {number}: {problem}")
        else:
            kept.append(draft)
    if len(rows) > MUTATIONS_MAX:
        refused.append(f"{len(rows) - MUTATIONS_MAX} changes beyond the first {MUTATIONS_MAX}")
    return kept, refused


def _mutation(
    row: Any, *, shown: Sequence[int], entries: Mapping[int, tuple[str, str]]
) -> tuple[MutationDraft | None, str]:
    if not isinstance(row, dict):
        return None, "not an object"
    op = row.get("op")
    if op not in ("add", "edit", "retire"):
        return None, f"an unknown operation ({str(op)[:20]!r})"
    numbers = [c for c in row.get("cites") or [] if isinstance(c, int) and 1 <= c <= len(shown)]
    cites = list(dict.fromkeys(shown[c - 1] for c in numbers))
    if not cites:
        return None, "it cites none of the decisions it was shown"
    section = " ".join(str(row.get("section") or "").split())
    text = " ".join(str(row.get("text") or "").split())
    why = " ".join(str(row.get("why") or "").split())[:300]
    key = None
    if op in ("edit", "retire"):
        name = _ENTRY_NAME.match(str(row.get("entry") or ""))
        key = int(name.group(1)) if name else None
        if key is None or key not in entries:
            return None, f"it names no rule of the playbook ({str(row.get('entry'))[:20]!r})"
        if op == "retire":
            section, text = entries[key]
        elif not section:
            section = entries[key][0]
        if op == "edit" and entries[key] == (section, text):
            return None, "it changes nothing"
    if op != "retire":
        problem = entry_problem(section=section, text=text)
        if problem is not None:
            return None, problem
    return MutationDraft(op=op, key=key, section=section, text=text, cites=cites, why=why), ""
