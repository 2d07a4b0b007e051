"""Example ↔ point: the one module that writes examples into the vector store.

One collection per queue; an example's UUID is its point id; the payload carries what
retrieval filters and weighs on (role, status, weight, reward). Indexing embeds the input and
upserts; deleting removes points; a payload sync follows status and weight (a retired
example keeps its point, marked retired, so that restoring it is a payload update too).
The worker runs these (in the default set-up it alone owns the store); the web enqueues them
through `memory.index_tasks` once its transaction commits."""

from collections import defaultdict
from collections.abc import Iterable, Sequence
from datetime import timedelta
from uuid import UUID

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from icrlhf.integrations import embeddings, vectors
from icrlhf.memory.models import Example

# Two examples closer than this say the same thing: retrieval keeps the better-ranked one,
# and indexing records the older one an example nearly repeats.
NEAR_DUPLICATE_COSINE = 0.95
# The index task normally runs within a second of the decision; the sweeper leaves those alone.
_SWEEP_GRACE = timedelta(seconds=30)


def collection_of(queue_id: int) -> str:
    """A queue's collection, named by its id: a slug can be renamed and given to another
    queue, an id never is (installs sharing one Qdrant stay apart by the prefix)."""
    return f"{settings.QDRANT_COLLECTION_PREFIX}_q{queue_id}"


def collection_of_slug(queue_slug: str) -> str:
    """Where a queue's examples were stored before collections were named by queue id."""
    return f"{settings.QDRANT_COLLECTION_PREFIX}_{queue_slug}"


def _by_collection(examples: Iterable[Example]) -> dict[str, list[Example]]:
    """Examples grouped by their queue's collection."""
    grouped: dict[str, list[Example]] = defaultdict(list)
    for example in examples:
        grouped[collection_of(example.queue_id)].append(example)
    return grouped


def examples_index(*, example_ids: Sequence[UUID | str], neighbours: bool = True) -> int:
    """Embed and upsert examples that still need it; returns how many were indexed.

    Idempotent: the example UUID is the point id, so indexing twice overwrites the same point.
    Raises VectorStoreUnavailable after marking the examples failed, so the task can retry.
    """
    examples = list(
        Example.objects.filter(pk__in=list(example_ids)).exclude(
            index_state=Example.IndexState.INDEXED
        )
    )
    if not examples:
        return 0
    texts = sorted({example.input_text for example in examples})
    vector_of = dict(zip(texts, embeddings.embed_texts(texts), strict=True))
    ids = [example.pk for example in examples]
    try:
        for collection, grouped in _by_collection(examples).items():
            vectors.upsert(
                collection=collection,
                points=[
                    vectors.Point(
                        id=example.pk,
                        vector=vector_of[example.input_text],
                        payload=_payload(example),
                    )
                    for example in grouped
                ],
            )
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
    examples = Example.objects.filter(pk__in=list(example_ids))
    for example in examples:
        vectors.payload_set(
            collection=collection_of(example.queue_id),
            ids=[example.pk],
            payload={"status": example.status, "weight": example.weight},
        )
    return len(examples)


def _neighbours_record(examples: Sequence[Example], vector_of: dict[str, list[float]]) -> None:
    """For each preferred example: its closest preferred neighbours, and the older example it
    nearly repeats, if any (cosine above NEAR_DUPLICATE_COSINE). A curation aid."""
    for example in examples:
        if example.role != Example.Role.PREFERRED:
            continue
        hits = vectors.search(
            collection=collection_of(example.queue_id),
            vector=vector_of[example.input_text],
            limit=6,
            match={"role": [Example.Role.PREFERRED]},
        )
        neighbours = [h for h in hits if h.id != example.pk][:5]
        older = Example.objects.filter(
            queue_id=example.queue_id,
            pk__in=[h.id for h in neighbours if h.score > NEAR_DUPLICATE_COSINE],
            created_at__lt=example.created_at,
        ).order_by("created_at")
        Example.objects.filter(pk=example.pk).update(
            similar=[{"id": str(h.id), "score": round(h.score, 4)} for h in neighbours],
            duplicate_of=older.first(),
        )


def points_delete(*, collection: str, point_ids: Sequence[UUID | str]) -> None:
    """Delete points whose examples are gone from the database."""
    vectors.delete(collection=collection, ids=[UUID(str(p)) for p in point_ids])


def points_of_examples(examples: Iterable[Example]) -> dict[str, list[str]]:
    """Each collection's point ids for these examples, kept before the rows are deleted."""
    return {
        collection: [str(example.pk) for example in grouped]
        for collection, grouped in _by_collection(examples).items()
    }


def examples_unindexed(*, limit: int = 500) -> list[str]:
    """Examples the index task has not managed to store: failed ones, and pending ones older
    than a normal indexing delay (their task was lost, the store was down, or an upgrade
    moved their collection). Retired ones too: a retired example keeps its point."""
    cutoff = timezone.now() - _SWEEP_GRACE
    return [
        str(pk)
        for pk in Example.objects.filter(
            Q(index_state=Example.IndexState.FAILED)
            | Q(index_state=Example.IndexState.PENDING, created_at__lt=cutoff)
        )
        .order_by("created_at")
        .values_list("pk", flat=True)[:limit]
    ]
