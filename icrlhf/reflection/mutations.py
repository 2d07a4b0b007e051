"""The reflector's answer, read as mutations: untrusted text, so each one is checked, and a
refused one is dropped with the reason."""

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from icrlhf.playbook.checks import entry_problem
from icrlhf.reflection.prompts import MUTATIONS_MAX, RULE_MAX_CHARS

_ENTRY_NAME = re.compile(r"^\s*E(\d+)\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class MutationDraft:
    op: str
    key: int | None
    section: str
    text: str
    cites: list[int]  # decisions' ids
    cites_runs: list[str]  # runs' ids
    why: str


def mutations_read(
    text: str,
    *,
    shown: Sequence[int],
    shown_runs: Sequence[str] = (),
    entries: Mapping[int, tuple[str, str]],
    requests: Sequence[str] = (),
) -> tuple[list[MutationDraft], list[str]]:
    """The mutations the answer proposes that can stand, and why each other was refused.
    `shown`: the ids of the decisions the reflector was shown, then `shown_runs`, the runs',
    in the order it numbered them from 1 (its citations are those numbers; a mutation's are
    the ids); `entries`: the playbook in force, by key ((section, text)); `requests`: what
    the batch's requests and goals said, as shown (a rule never copies one)."""
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
        draft, problem = _mutation(row, shown=shown, shown_runs=shown_runs, entries=entries)
        if draft is not None and draft.op != "retire":
            problem = _copied(draft, kept=kept, requests=requests)
        if draft is None or problem:
            refused.append(f"change {number}: {problem}")
        else:
            kept.append(draft)
    if len(rows) > MUTATIONS_MAX:
        refused.append(f"{len(rows) - MUTATIONS_MAX} changes beyond the first {MUTATIONS_MAX}")
    return kept, refused


def _mutation(
    row: Any,
    *,
    shown: Sequence[int],
    shown_runs: Sequence[str],
    entries: Mapping[int, tuple[str, str]],
) -> tuple[MutationDraft | None, str]:
    if not isinstance(row, dict):
        return None, "not an object"
    op = row.get("op")
    if op not in ("add", "edit", "retire"):
        return None, f"an unknown operation ({str(op)[:20]!r})"
    traces = len(shown) + len(shown_runs)
    numbers = [c for c in row.get("cites") or [] if isinstance(c, int) and 1 <= c <= traces]
    cites = list(dict.fromkeys(shown[c - 1] for c in numbers if c <= len(shown)))
    cites_runs = list(
        dict.fromkeys(shown_runs[c - 1 - len(shown)] for c in numbers if c > len(shown))
    )
    if not cites and not cites_runs:
        return None, "it cites none of the decisions or runs it was shown"
    section = " ".join(str(row.get("section") or "").split())
    text = _whole_sentences(" ".join(str(row.get("text") or "").split()))
    if text is None:
        return None, f"its rule was cut at {RULE_MAX_CHARS} characters, mid-sentence"
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
    if op == "add" and any(held == text for _section, held in entries.values()):
        return None, "the playbook holds that rule already"
    if op != "retire":
        problem = entry_problem(section=section, text=text)
        if problem is not None:
            return None, problem
    draft = MutationDraft(
        op=op, key=key, section=section, text=text, cites=cites, cites_runs=cites_runs, why=why
    )
    return draft, ""


_SENTENCE_END = re.compile(r"[.!?](?=\s|$)")


def _whole_sentences(text: str) -> str | None:
    """A rule the schema cut at its longest, down to its last whole sentence (None: it has
    none); any other as it is."""
    if len(text) < RULE_MAX_CHARS or text.endswith((".", "!", "?")):
        return text
    ends = [match.end() for match in _SENTENCE_END.finditer(text)]
    return text[: ends[-1]] if ends else None


# A request's words this long inside a rule are one customer's, not a general rule.
_COPIED_MIN_CHARS = 24
# The reflector's prompt's own words about the playbook (prompts.reflector_messages), which
# the 1.5B, shown an empty playbook, once wrote back as its rule.
_PROMPT_WORDS = ("(no rules yet)", "the playbook (version")


def _copied(draft: MutationDraft, *, kept: Sequence[MutationDraft], requests: Sequence[str]) -> str:
    """Why the draft repeats what it should not (an earlier change of the same answer, the
    reflector's prompt, or a request of the batch), or "" when it does not."""
    if any(other.op != "retire" and other.text == draft.text for other in kept):
        return "it repeats an earlier change of this answer"
    lowered = draft.text.casefold()
    if any(words in lowered for words in _PROMPT_WORDS):
        return "it copies the reflector's prompt, not a rule"
    for request in requests:
        words = " ".join(request.split()).casefold().rstrip("…")
        if len(words) >= _COPIED_MIN_CHARS and words[: _COPIED_MIN_CHARS * 4] in lowered:
            return "it copies a request of the batch: a rule is general, never one customer's"
    return ""
