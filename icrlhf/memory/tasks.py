from typing import Any

from celery import shared_task

from icrlhf.integrations.vectors import VectorStoreUnavailable
from icrlhf.memory import index

_SWEEP_BATCH = 64


# The store may be down for a while (a restart, a network blip): retry with backoff, and the
# sweeper picks up whatever still fails after that.
_STORE_RETRIES: dict[str, Any] = {
    "autoretry_for": (VectorStoreUnavailable,),
    "max_retries": 5,
    "retry_backoff": 2,
    "retry_backoff_max": 60,
    "retry_jitter": True,
}


@shared_task(name="memory.examples_index", **_STORE_RETRIES)
def examples_index(example_ids: list[str]) -> None:
    index.examples_index(example_ids=example_ids)


@shared_task(name="memory.examples_sweep")
def examples_sweep() -> None:
    """Periodic: re-enqueue whatever the index task has not stored (after an outage, a crash)."""
    ids = index.examples_unindexed()
    for start in range(0, len(ids), _SWEEP_BATCH):
        examples_index.delay(ids[start : start + _SWEEP_BATCH])


@shared_task(name="memory.examples_payload_sync", **_STORE_RETRIES)
def examples_payload_sync(example_ids: list[str]) -> None:
    index.examples_payload_sync(example_ids=example_ids)


@shared_task(name="memory.examples_points_delete", **_STORE_RETRIES)
def examples_points_delete(collection: str, point_ids: list[str]) -> None:
    index.points_delete(collection=collection, point_ids=point_ids)


@shared_task(name="memory.examples_prune")
def examples_prune() -> None:
    """Periodic: retire low-utility examples in every queue (thresholds per queue)."""
    from icrlhf.memory.curation import examples_prune as prune
    from icrlhf.queues.models import Queue

    for queue in Queue.objects.all():
        prune(queue=queue)


# These two answer the management commands, through the worker that owns the store.
@shared_task(name="memory.check", ignore_result=False)
def memory_check(queue_slug: str | None = None) -> dict[str, Any]:
    from icrlhf.memory.integrity import memory_check as check

    return check(queue_slug=queue_slug)


@shared_task(name="memory.reindex", ignore_result=False)
def memory_reindex(queue_slug: str | None = None) -> dict[str, Any]:
    from icrlhf.memory.integrity import memory_reindex as reindex

    return reindex(queue_slug=queue_slug)
