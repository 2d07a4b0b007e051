"""Queue kinds: what differs between kinds of queue (prompt instructions, reading a model's
answer, confirmed fields, what a decision changes, review order, item page parts), below every
flow. Generation, memory, review and the ticket flow ask `kind_of(queue)`, never the kind's name.
A new kind is a package here, its templates under templates/kinds/<name>/, and a line below."""

from icrlhf.kinds.base import Final, Parsed, QueueKind
from icrlhf.kinds.triage import TriageKind
from icrlhf.queues.models import Queue

KINDS: dict[str, QueueKind] = {
    Queue.Kind.GENERAL: QueueKind(),
    Queue.Kind.TRIAGE: TriageKind(),
}


def kind_of(queue: Queue) -> QueueKind:
    return KINDS[queue.kind]


__all__ = ["KINDS", "Final", "Parsed", "QueueKind", "kind_of"]
