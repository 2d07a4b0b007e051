"""Queue kinds: what differs between kinds of queue (prompt instructions, reading a model's
answer, confirmed fields, what a decision changes, review order, item page parts, whether its
items are tickets), below every flow. Generation, memory, review, the ticket flow and the API
ask `kind_of(queue)`, never the kind's name.
A new kind is a package here, its templates under templates/kinds/<name>/, and a line in
INSTALLED_KINDS."""

from collections.abc import Iterable

from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from icrlhf.kinds.base import Final, Parsed, QueueKind
from icrlhf.queues.models import Queue

# The kinds this install offers, by dotted path to their class: one line each.
INSTALLED_KINDS = (
    "icrlhf.kinds.base.QueueKind",
    "icrlhf.kinds.triage.TriageKind",
)


def kinds_load(paths: Iterable[str]) -> dict[str, QueueKind]:
    """One instance of each kind, by its name (what `Queue.kind` stores)."""
    kinds: dict[str, QueueKind] = {}
    for path in paths:
        kind = import_string(path)()
        if not isinstance(kind, QueueKind):
            raise ImproperlyConfigured(f"{path} is not a QueueKind.")
        if kind.name in kinds:
            raise ImproperlyConfigured(f"{path}: a kind named {kind.name!r} is installed twice.")
        kinds[kind.name] = kind
    return kinds


KINDS: dict[str, QueueKind] = kinds_load(INSTALLED_KINDS)


def kind_of(queue: Queue) -> QueueKind:
    return KINDS[queue.kind]


__all__ = ["INSTALLED_KINDS", "KINDS", "Final", "Parsed", "QueueKind", "kind_of", "kinds_load"]
