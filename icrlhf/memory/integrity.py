"""Keeping the vector store a faithful copy of the database's examples."""

from typing import Any

from icrlhf.integrations import embeddings, vectors
from icrlhf.memory import index
from icrlhf.memory.models import Example
from icrlhf.queues.models import Queue

_REINDEX_BATCH = 256
_SAMPLE = 10


def _queues(queue_slug: str | None) -> list[Queue]:
    queues = Queue.objects.all()
    return list(queues.filter(slug=queue_slug) if queue_slug else queues)


def memory_check(*, queue_slug: str | None = None) -> dict[str, Any]:
    """Compares database and store, per queue: counts, ids, embedding model."""
    model = embeddings.model_id()
    report: dict[str, Any] = {"embedding_model": model, "queues": {}, "drift": False}
    for queue in _queues(queue_slug):
        rows = dict(Example.objects.filter(queue=queue).values_list("pk", "embedding_model"))
        points = vectors.point_ids(collection=index.collection_of(queue.pk))
        missing = sorted(str(pk) for pk in set(rows) - points)
        orphans = sorted(str(pk) for pk in points - set(rows))
        stale = sorted(str(pk) for pk, used in rows.items() if used and used != model)
        queue_report = {
            "examples": len(rows),
            "points": len(points),
            "missing_in_store": len(missing),
            "orphan_points": len(orphans),
            "other_embedding_model": len(stale),
            "samples": {
                "missing": missing[:_SAMPLE],
                "orphans": orphans[:_SAMPLE],
                "other_model": stale[:_SAMPLE],
            },
        }
        report["queues"][queue.slug] = queue_report
        report["drift"] |= bool(missing or orphans or stale)
    return report


def memory_reindex(*, queue_slug: str | None = None) -> dict[str, Any]:
    """Rebuild collections from the database: same point ids (the example UUIDs)."""
    counts: dict[str, int] = {}
    for queue in _queues(queue_slug):
        vectors.collection_drop(collection=index.collection_of(queue.pk))
        # Before collections were named by queue id, by slug: that copy goes too.
        vectors.collection_drop(collection=index.collection_of_slug(queue.slug))
        ids = list(Example.objects.filter(queue=queue).values_list("pk", flat=True))
        Example.objects.filter(pk__in=ids).update(index_state=Example.IndexState.PENDING)
        for start in range(0, len(ids), _REINDEX_BATCH):
            index.examples_index(example_ids=ids[start : start + _REINDEX_BATCH], neighbours=False)
        counts[queue.slug] = len(ids)
    return {"reindexed": counts}
