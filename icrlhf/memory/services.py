import logging
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from uuid import UUID

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from icrlhf.integrations import embeddings, vectors
from icrlhf.memory import tasks
from icrlhf.memory.models import Example, Retrieval
from icrlhf.memory.selectors import RetrievedExample

logger = logging.getLogger(__name__)

PREFERRED_REWARD = 1.0
REJECTED_REWARD = 0.0
# The index task normally runs within a second of the decision; the sweeper leaves those alone.
_SWEEP_GRACE = timedelta(seconds=30)


@dataclass(frozen=True)
class ExampleDraft:
    """One answer a decision teaches: the candidate it came from (none for a reviewer's own
    text) and the text later prompts will show."""

    candidate_id: int | None
    output_text: str


def examples_record(
    *,
    decision_id: int,
    queue_id: int,
    input_text: str,
    preferred: ExampleDraft | None,
    rejected: Sequence[ExampleDraft],
) -> list[Example]:
    """Store what a decision teaches as rewarded examples (preferred 1.0, rejected 0.0) and
    index them once the decision commits. Must run inside the decision's transaction."""
    drafts = (
        [(preferred, PREFERRED_REWARD, Example.Role.PREFERRED)] if preferred is not None else []
    )
    drafts += [(draft, REJECTED_REWARD, Example.Role.REJECTED) for draft in rejected]
    examples = Example.objects.bulk_create(
        Example(
            queue_id=queue_id,
            decision_id=decision_id,
            candidate_id=draft.candidate_id,
            input_text=input_text,
            output_text=draft.output_text,
            reward=reward,
            role=role,
        )
        for draft, reward, role in drafts
    )
    example_ids = [str(example.pk) for example in examples]
    # robust: with the broker down the decision still succeeds; the examples stay pending and
    # the memory sweeper indexes them once the broker is back.
    transaction.on_commit(lambda: tasks.examples_index.delay(example_ids), robust=True)
    return examples


def examples_withdraw(*, decision_id: int) -> None:
    """An undone decision's examples leave the memory: retired, and their points deleted."""
    examples = Example.objects.filter(decision_id=decision_id)
    example_ids = [str(pk) for pk in examples.values_list("pk", flat=True)]
    examples.update(status=Example.Status.RETIRED)
    transaction.on_commit(lambda: tasks.examples_unindex.delay(example_ids), robust=True)


def examples_unindex(*, example_ids: Sequence[UUID | str]) -> None:
    rows = Example.objects.filter(pk__in=list(example_ids)).select_related("queue")
    by_collection: dict[str, list[UUID]] = defaultdict(list)
    for example in rows:
        by_collection[vectors.collection_name(example.queue.slug)].append(example.pk)
    for collection, ids in by_collection.items():
        vectors.delete(collection=collection, ids=ids)
    Example.objects.filter(pk__in=list(example_ids)).update(
        index_state=Example.IndexState.PENDING, indexed_at=None
    )


def retrievals_record(*, generation_id: int, retrieved: Sequence[RetrievedExample]) -> None:
    Retrieval.objects.bulk_create(
        Retrieval(generation_id=generation_id, example=r.example, score=r.score, rank=r.rank)
        for r in retrieved
    )


def examples_index(*, example_ids: Sequence[UUID | str], neighbours: bool = True) -> int:
    """Embed and upsert examples that still need it; returns how many were indexed.

    Idempotent: the example UUID is the point id, so indexing twice overwrites the same point.
    Raises VectorStoreUnavailable after marking the examples failed, so the task can retry.
    """
    examples = list(
        Example.objects.filter(pk__in=list(example_ids))
        .exclude(index_state=Example.IndexState.INDEXED)
        .select_related("queue")
    )
    if not examples:
        return 0
    texts = sorted({example.input_text for example in examples})
    vector_of = dict(zip(texts, embeddings.embed_texts(texts), strict=True))
    by_collection: dict[str, list[vectors.Point]] = defaultdict(list)
    for example in examples:
        by_collection[vectors.collection_name(example.queue.slug)].append(
            vectors.Point(
                id=example.pk,
                vector=vector_of[example.input_text],
                payload=_payload(example),
            )
        )
    ids = [example.pk for example in examples]
    try:
        for collection, points in by_collection.items():
            vectors.upsert(collection=collection, points=points)
    except vectors.VectorStoreUnavailable as error:
        Example.objects.filter(pk__in=ids).update(
            index_state=Example.IndexState.FAILED, index_error=str(error)[:1000]
        )
        raise
    Example.objects.filter(pk__in=ids).update(
        index_state=Example.IndexState.INDEXED,
        index_error="",
        embedding_model=embeddings.model_id(),
        indexed_at=timezone.now(),
    )
    if neighbours:  # after the state is saved: they are not part of "retrievable"
        _neighbours_record(examples, vector_of)
    return len(ids)


def _payload(example: Example) -> dict[str, object]:
    return {
        "queue_id": example.queue_id,
        "role": example.role,
        "status": example.status,
        "weight": example.weight,
        "reward": example.reward,
    }


def examples_payload_sync(*, example_ids: Sequence[UUID | str]) -> int:
    """Bring the points' status and weight in line with the database (one update a point)."""
    examples = Example.objects.filter(pk__in=list(example_ids)).select_related("queue")
    for example in examples:
        vectors.payload_set(
            collection=vectors.collection_name(example.queue.slug),
            ids=[example.pk],
            payload={"status": example.status, "weight": example.weight},
        )
    return len(examples)


def _neighbours_record(examples: Sequence[Example], vector_of: dict[str, list[float]]) -> None:
    """For each preferred example: its closest preferred neighbours, and the older example it
    nearly repeats, if any (cosine above NEAR_DUPLICATE_COSINE). A curation aid."""
    from icrlhf.memory.selectors import NEAR_DUPLICATE_COSINE

    for example in examples:
        if example.role != Example.Role.PREFERRED:
            continue
        hits = vectors.search(
            collection=vectors.collection_name(example.queue.slug),
            vector=vector_of[example.input_text],
            limit=6,
            match={"role": [Example.Role.PREFERRED]},
        )
        neighbours = [h for h in hits if h.id != example.pk][:5]
        older = Example.objects.filter(
            pk__in=[h.id for h in neighbours if h.score > NEAR_DUPLICATE_COSINE],
            created_at__lt=example.created_at,
        ).order_by("created_at")
        Example.objects.filter(pk=example.pk).update(
            similar=[{"id": str(h.id), "score": round(h.score, 4)} for h in neighbours],
            duplicate_of=older.first(),
        )


def examples_unindexed(*, limit: int = 500) -> list[str]:
    """Examples the index task has not managed to store: failed ones, and pending ones older
    than a normal indexing delay (their task was lost, or the store was down)."""
    cutoff = timezone.now() - _SWEEP_GRACE
    return [
        str(pk)
        for pk in Example.objects.filter(
            Q(index_state=Example.IndexState.FAILED)
            | Q(index_state=Example.IndexState.PENDING, created_at__lt=cutoff)
        )
        .exclude(status=Example.Status.RETIRED)
        .order_by("created_at")
        .values_list("pk", flat=True)[:limit]
    ]
