from dataclasses import dataclass

from django.db.models import QuerySet

from icrlhf.playbook.models import Entry, Version
from icrlhf.queues.models import Queue


@dataclass(frozen=True)
class PlaybookInForce:
    """What a prompt carries of the queue's playbook, and which version that is."""

    version_id: int | None = None
    number: int | None = None
    text: str = ""


def playbook_in_force(queue: Queue) -> PlaybookInForce:
    """One query: the newest version's number and its text as prompts carry it."""
    row = (
        Version.objects.filter(queue=queue)
        .order_by("-number")
        .values_list("pk", "number", "prompt_text")
        .first()
    )
    return PlaybookInForce() if row is None else PlaybookInForce(*row)


def current_version(queue: Queue) -> Version | None:
    """The version prompts carry now: the newest (a rollback is a new version)."""
    return Version.objects.filter(queue=queue).order_by("-number").first()


def version_entries(version: Version | None) -> list[Entry]:
    """Its entries, by section then key (the prompt's order and the pages')."""
    if version is None:
        return []
    return list(version.entries.order_by("section", "key", "pk"))


def versions_of(queue: Queue) -> QuerySet[Version]:
    return Version.objects.filter(queue=queue).select_related("author").order_by("-number")


@dataclass(frozen=True)
class VersionChanges:
    """A version and what it changed from the one before it."""

    version: Version
    added: list[Entry]
    edited: list[Entry]  # the new texts
    retired: list[Entry]  # as they were
    size: int


def versions_history(queue: Queue, *, limit: int = 30) -> list[VersionChanges]:
    """The newest `limit` versions, each with its changes (two queries)."""
    versions = list(versions_of(queue).prefetch_related("entries")[: limit + 1])
    history = []
    for number, version in enumerate(versions):
        before = versions[number + 1] if number + 1 < len(versions) else None
        now = {e.key: e for e in version.entries.all()}
        then = {e.key: e for e in before.entries.all()} if before is not None else {}
        history.append(
            VersionChanges(
                version=version,
                added=[e for key, e in sorted(now.items()) if key not in then],
                edited=[
                    e for key, e in sorted(now.items()) if key in then and then[key].pk != e.pk
                ],
                retired=[e for key, e in sorted(then.items()) if key not in now],
                size=len(now),
            )
        )
    return history[:limit]


def by_section(entries: list[Entry]) -> list[tuple[str, list[Entry]]]:
    """The entries grouped under their sections, in the entries' order."""
    sections: dict[str, list[Entry]] = {}
    for entry in entries:
        sections.setdefault(entry.section, []).append(entry)
    return list(sections.items())


def prompt_text(entries: list[Entry]) -> str:
    """How a prompt carries the entries: each section's name, then its rules."""
    return "\n".join(
        f"{section}:\n" + "\n".join(f"- {entry.text}" for entry in rules)
        for section, rules in by_section(entries)
    )
