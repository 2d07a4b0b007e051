"""Writing a queue's playbook: every change is a new version, authored and kept, so any
earlier one can be restored and every prompt says which one it carried."""

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import F

from icrlhf.integrations.redaction import redact
from icrlhf.playbook.checks import entry_problem
from icrlhf.playbook.models import ENTRIES_MAX, Entry, Version
from icrlhf.playbook.selectors import current_version, prompt_text, version_entries
from icrlhf.queues.models import Queue

EXPORT_FORMAT = "icrlhf-playbook"
EXPORT_FORMAT_VERSION = 1


@dataclass(frozen=True)
class EntryDraft:
    section: str
    text: str
    # The entry this one keeps or edits (its key); None: a new entry.
    key: int | None = None
    sources: Sequence[int] = field(default_factory=tuple)  # decisions' ids
    run_sources: Sequence[str] = field(default_factory=tuple)  # agents' runs' ids

    @classmethod
    def of(cls, entry: Entry) -> "EntryDraft":
        """The entry as it stands, to carry into the next version."""
        return cls(
            section=entry.section,
            text=entry.text,
            key=entry.key,
            sources=entry.sources,
            run_sources=entry.run_sources,
        )


def entry_draft_clean(draft: EntryDraft) -> EntryDraft:
    """The draft as it may be stored: trimmed, redacted (it may quote an end user), and
    checked; a refusal says why."""
    section = " ".join(draft.section.split())
    text = redact(" ".join(draft.text.split())).text
    problem = entry_problem(section=section, text=text)
    if problem is not None:
        raise ValidationError(f"This rule cannot be saved: {problem}.")
    return replace(draft, section=section, text=text)


@transaction.atomic
def version_create(
    *,
    queue_id: int,
    drafts: Sequence[EntryDraft],
    origin: str,
    author: User | None,
    summary: str = "",
    restored_from: Version | None = None,
) -> Version:
    """The playbook's next version, holding `drafts` (each checked; the first refusal names
    its entry and nothing is saved). An entry whose key, section and text are those of an
    entry the queue has is that entry again (its counts go on); a changed text under a key
    is an edit of it."""
    queue = Queue.objects.select_for_update().get(pk=queue_id)  # versions are numbered in turn
    if len(drafts) > ENTRIES_MAX:
        raise ValidationError(
            f"A playbook holds at most {ENTRIES_MAX} entries (each is in every prompt); "
            f"this one would hold {len(drafts)}. Retire some first."
        )
    cleaned = []
    for position, draft in enumerate(drafts, start=1):
        try:
            cleaned.append(entry_draft_clean(draft))
        except ValidationError as error:
            raise ValidationError(f"Entry {position}: {error.messages[0]}") from error
    current = current_version(queue)
    in_force = {(e.section, e.text): e for e in version_entries(current)}
    every = list(Entry.objects.filter(queue=queue).order_by("pk"))
    known = {(e.key, e.section, e.text): e for e in every}
    latest_of_key = {e.key: e for e in every}
    next_key = max((e.key for e in every), default=0) + 1
    entries = []
    for draft in cleaned:
        if draft.key is None:  # a new rule in words the playbook holds is that rule
            same = in_force.get((draft.section, draft.text))
        else:
            same = known.get((draft.key, draft.section, draft.text))
        if same is None:
            key = draft.key if draft.key in latest_of_key else None
            if key is None:
                key, next_key = next_key, next_key + 1
            same = Entry.objects.create(
                queue=queue,
                key=key,
                section=draft.section,
                text=draft.text,
                revises=latest_of_key.get(key),
                sources=list(dict.fromkeys(draft.sources)),
                run_sources=list(dict.fromkeys(draft.run_sources)),
            )
        entries.append(same)
    twice = sorted({e.name for e in entries if sum(o.key == e.key for o in entries) > 1})
    if twice:
        raise ValidationError(f"This version would hold {', '.join(twice)} twice; keep one.")
    if current is not None and {e.pk for e in entries} == set(
        current.entries.values_list("pk", flat=True)
    ):
        raise ValidationError("Nothing changed: this is the playbook as it stands.")
    version = Version.objects.create(
        queue=queue,
        number=(current.number if current else 0) + 1,
        origin=origin,
        author=author,
        summary=summary[:300],
        restored_from=restored_from,
        prompt_text=prompt_text(sorted(entries, key=lambda e: (e.section, e.key, e.pk))),
    )
    version.entries.set(entries)
    return version


def _current_drafts(queue: Queue) -> list[EntryDraft]:
    return [EntryDraft.of(e) for e in version_entries(current_version(queue))]


def entry_add(*, queue: Queue, section: str, text: str, author: User) -> Version:
    entry_draft_clean(EntryDraft(section=section, text=text))  # its own refusal, unnumbered
    drafts = [*_current_drafts(queue), EntryDraft(section=section, text=text)]
    return version_create(
        queue_id=queue.pk,
        drafts=drafts,
        origin=Version.Origin.WRITTEN,
        author=author,
        summary=f"Added a rule to {' '.join(section.split())}.",
    )


def entry_edit(*, queue: Queue, key: int, section: str, text: str, author: User) -> Version:
    drafts = _current_drafts(queue)
    if key not in {d.key for d in drafts}:
        raise ValidationError(f"E{key} is not in the current playbook: nothing was changed.")
    entry_draft_clean(EntryDraft(section=section, text=text))  # its own refusal, unnumbered
    edited = [replace(d, section=section, text=text) if d.key == key else d for d in drafts]
    return version_create(
        queue_id=queue.pk,
        drafts=edited,
        origin=Version.Origin.WRITTEN,
        author=author,
        summary=f"Edited E{key}.",
    )


def entry_retire(*, queue: Queue, key: int, author: User) -> Version:
    drafts = _current_drafts(queue)
    if key not in {d.key for d in drafts}:
        raise ValidationError(f"E{key} is not in the current playbook: nothing was changed.")
    return version_create(
        queue_id=queue.pk,
        drafts=[d for d in drafts if d.key != key],
        origin=Version.Origin.WRITTEN,
        author=author,
        summary=f"Retired E{key}.",
    )


def version_restore(*, queue: Queue, number: int, author: User) -> Version:
    """One action: the playbook as it was in version `number`, as a new version."""
    earlier = Version.objects.filter(queue=queue, number=number).first()
    if earlier is None:
        raise ValidationError(f"This queue's playbook has no version {number}.")
    return version_create(
        queue_id=queue.pk,
        drafts=[EntryDraft.of(e) for e in version_entries(earlier)],
        origin=Version.Origin.ROLLBACK,
        author=author,
        summary=f"Restored version {number}.",
        restored_from=earlier,
    )


def playbook_export(queue: Queue) -> dict[str, Any]:
    version = current_version(queue)
    return {
        "format": EXPORT_FORMAT,
        "format_version": EXPORT_FORMAT_VERSION,
        "queue": queue.slug,
        "version": version.number if version else None,
        "entries": [
            {
                "id": entry.name,
                "section": entry.section,
                "text": entry.text,
                "sources": entry.sources,
                "run_sources": entry.run_sources,
                "first_chosen": entry.first_chosen,
                "first_not_chosen": entry.first_not_chosen,
            }
            for entry in version_entries(version)
        ],
    }


def playbook_import(*, queue: Queue, raw: bytes, author: User) -> Version:
    """A playbook exported from this queue or another, as the queue's next version. An entry
    the queue already holds word for word is that entry again; any other is new here, and
    keeps no sources (they would be another queue's decisions and runs). Words are matched
    under their section."""
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValidationError(f"The file is not JSON ({error}); nothing was imported.") from error
    if not isinstance(data, dict) or data.get("format") != EXPORT_FORMAT:
        raise ValidationError(
            f'The file is not a playbook: it needs "format": "{EXPORT_FORMAT}", as the '
            "playbook's export writes it. Nothing was imported."
        )
    rows = data.get("entries")
    if not isinstance(rows, list) or not all(isinstance(row, dict) for row in rows):
        raise ValidationError('"entries" must be a list of objects; nothing was imported.')
    held = {(e.section, e.text): e.key for e in Entry.objects.filter(queue=queue)}
    drafts = []
    for position, row in enumerate(rows, start=1):
        section, text = row.get("section"), row.get("text")
        if not isinstance(section, str) or not isinstance(text, str):
            raise ValidationError(
                f'Entry {position}: "section" and "text" must be strings; nothing was imported.'
            )
        key = held.get((" ".join(section.split()), " ".join(text.split())))
        drafts.append(EntryDraft(section=section, text=text, key=key))
    return version_create(
        queue_id=queue.pk,
        drafts=drafts,
        origin=Version.Origin.IMPORTED,
        author=author,
        summary=f"Imported {len(drafts)} entries.",
    )


def outcome_record(*, version_id: int | None, first_chosen: bool, undo: bool = False) -> None:
    """A reviewed generation's outcome, counted on each entry its prompt held (an undo takes
    it back)."""
    if version_id is None:
        return
    counter = "first_chosen" if first_chosen else "first_not_chosen"
    step = -1 if undo else 1
    entries = Entry.objects.filter(versions=version_id)
    if undo:
        entries = entries.filter(**{f"{counter}__gt": 0})
    entries.update(**{counter: F(counter) + step})
