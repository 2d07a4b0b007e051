"""What curators do to the memory, and what the memory does to itself (pruning, usage).

Every change is written to the database first, with a CurationEvent, and reaches the vector
store through the worker once the transaction commits: a payload update for status and
weight (constant cost, whatever the store's size), a re-index for an edited text, a point
deletion for a deleted example."""

from collections.abc import Iterable, Sequence
from datetime import datetime
from uuid import UUID

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from icrlhf.memory import index, index_tasks
from icrlhf.memory.models import CurationEvent, Example, Retrieval
from icrlhf.queues.models import Queue

MAX_WEIGHT = 10.0


def utility_of(*, retrieved: int, accepted: int) -> float:
    """Laplace-smoothed acceptance rate: 0.5 before any evidence, then towards the rate."""
    return (accepted + 1) / (retrieved + 2)


def _record(actor: User | None, action: str, examples: Iterable[Example], **detail: object) -> None:
    CurationEvent.objects.bulk_create(
        CurationEvent(
            actor=actor, action=action, example_id=e.pk, queue_id=e.queue_id, detail=detail
        )
        for e in examples
    )


def _sync_payloads(ids: Sequence[UUID]) -> None:
    example_ids = [str(pk) for pk in ids]
    transaction.on_commit(lambda: index_tasks.examples_payload_sync.delay(example_ids), robust=True)


@transaction.atomic
def examples_status_set(
    *, ids: Sequence[UUID], status: str, actor: User | None, reason: str = ""
) -> int:
    """Pin, retire or restore (back to active). Returns how many examples changed."""
    examples = list(Example.objects.select_for_update().filter(pk__in=ids).exclude(status=status))
    if not examples:
        return 0
    retiring = status == Example.Status.RETIRED
    Example.objects.filter(pk__in=[e.pk for e in examples]).update(
        status=status,
        retired_reason=reason if retiring else "",
        retired_at=timezone.now() if retiring else None,
    )
    action = {"pinned": "pin", "retired": "retire", "active": "restore"}[status]
    _record(actor, action, examples, reason=reason)
    _sync_payloads([e.pk for e in examples])
    return len(examples)


@transaction.atomic
def examples_approve(*, ids: Sequence[UUID], approved: bool, actor: User | None) -> int:
    """Approve examples (or withdraw the approval) for being served as answers from memory."""
    examples = list(
        Example.objects.select_for_update()
        .filter(pk__in=ids)
        .filter(approved_for_answers_at__isnull=approved)
    )
    Example.objects.filter(pk__in=[e.pk for e in examples]).update(
        approved_for_answers_at=timezone.now() if approved else None
    )
    _record(actor, "approve" if approved else "withdraw_approval", examples)
    return len(examples)


@transaction.atomic
def example_output_edit(*, example_id: UUID, output_text: str, actor: User | None) -> Example:
    output_text = output_text.strip()
    if not output_text:
        raise ValidationError("The output cannot be empty.")
    example = Example.objects.select_for_update().get(pk=example_id)
    previous = example.output_text
    example.output_text = output_text
    example.index_state = Example.IndexState.PENDING
    example.approved_for_answers_at = None  # an edited answer is approved afresh
    example.save(update_fields=["output_text", "index_state", "approved_for_answers_at"])
    _record(actor, "edit", [example], previous=previous[:2000])
    ids = [str(example.pk)]
    transaction.on_commit(lambda: index_tasks.examples_index.delay(ids), robust=True)
    return example


@transaction.atomic
def examples_reweight(*, ids: Sequence[UUID], weight: float, actor: User | None) -> int:
    if not 0 <= weight <= MAX_WEIGHT:
        raise ValidationError(f"A weight is between 0 and {MAX_WEIGHT:g}.")
    examples = list(Example.objects.filter(pk__in=ids))
    Example.objects.filter(pk__in=ids).update(weight=weight)
    _record(actor, "reweight", examples, weight=weight)
    _sync_payloads([e.pk for e in examples])
    return len(examples)


@transaction.atomic
def examples_delete(*, ids: Sequence[UUID], actor: User | None) -> int:
    examples = list(Example.objects.filter(pk__in=ids).select_related("queue"))
    points = index.points_of_examples(examples)
    _record(actor, "delete", examples)
    Example.objects.filter(pk__in=ids).delete()
    for collection, point_ids in points.items():
        _delete_points_on_commit(collection, point_ids)
    return len(examples)


def _delete_points_on_commit(collection: str, point_ids: list[str]) -> None:
    transaction.on_commit(
        lambda: index_tasks.examples_points_delete.delay(collection, point_ids), robust=True
    )


@transaction.atomic
def examples_merge(*, ids: Sequence[UUID], actor: User | None) -> Example:
    """Keep the oldest of near-duplicate preferred examples; retire the others into it, and
    add their usage to it."""
    examples = list(Example.objects.select_for_update().filter(pk__in=ids).order_by("created_at"))
    if len(examples) < 2 or len({e.queue_id for e in examples}) > 1:
        raise ValidationError("Choose at least two examples of one queue to merge.")
    keep, *others = examples
    keep.times_retrieved += sum(e.times_retrieved for e in others)
    keep.times_accepted += sum(e.times_accepted for e in others)
    keep.utility = utility_of(retrieved=keep.times_retrieved, accepted=keep.times_accepted)
    keep.save(update_fields=["times_retrieved", "times_accepted", "utility"])
    Example.objects.filter(pk__in=[e.pk for e in others]).update(
        status=Example.Status.RETIRED,
        retired_reason=f"merged into {keep.pk}",
        retired_at=timezone.now(),
        duplicate_of=keep,
    )
    _record(actor, "merge", others, into=str(keep.pk))
    _sync_payloads([e.pk for e in others])
    return keep


def examples_usage_record(
    *, generation_id: int, generated_at: datetime, accepted: bool, undo: bool = False
) -> None:
    """Credit (or, on undo, debit) the examples a decided generation was prompted with:
    retrieved once more, accepted if the reviewer took a candidate as it was."""
    example_ids = list(
        Retrieval.objects.filter(generation_id=generation_id, format_only=False).values_list(
            "example_id", flat=True
        )
    )
    examples_credit(example_ids=example_ids, used_at=generated_at, accepted=accepted, undo=undo)


def examples_credit(
    *, example_ids: Sequence[UUID | str], used_at: datetime, accepted: bool, undo: bool = False
) -> None:
    """One more use of these examples (one less, on undo), helpful or not; their utility,
    which pruning reads, follows."""
    if not example_ids:
        return
    step = -1 if undo else 1
    accepted_step = step if accepted else 0
    examples = Example.objects.filter(pk__in=example_ids)
    examples.update(
        times_retrieved=F("times_retrieved") + step,
        times_accepted=F("times_accepted") + accepted_step,
        last_retrieved_at=used_at,
    )
    for example in examples.only("pk", "times_retrieved", "times_accepted"):
        Example.objects.filter(pk=example.pk).update(
            utility=utility_of(retrieved=example.times_retrieved, accepted=example.times_accepted)
        )


def examples_prune(*, queue: Queue) -> int:
    """Retire the queue's examples that have been retrieved enough and rarely helped."""
    doomed = list(
        Example.objects.filter(
            queue=queue,
            status=Example.Status.ACTIVE,
            times_retrieved__gte=queue.prune_min_retrievals,
            utility__lt=queue.prune_max_utility,
        )
    )
    for example in doomed:
        examples_status_set(
            ids=[example.pk],
            status=Example.Status.RETIRED,
            actor=None,
            reason=(
                f"utility {example.utility:.2f} after {example.times_retrieved} retrievals "
                f"(below {queue.prune_max_utility:.2f})"
            ),
        )
    return len(doomed)
