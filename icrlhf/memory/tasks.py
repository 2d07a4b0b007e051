"""The memory's periodic and on-demand tasks. The store's writes that services and curation
enqueue are tasks too, one level down (`index_tasks`, imported here so that the worker,
which discovers this module, registers them)."""

from typing import Any

from celery import shared_task

from icrlhf.memory import curation, index, index_tasks, integrity
from icrlhf.queues.models import Queue

_SWEEP_BATCH = 64


@shared_task(name="memory.examples_sweep")
def examples_sweep() -> None:
    """Periodic: re-enqueue whatever the index task has not stored (after an outage, a crash)."""
    ids = index.examples_unindexed()
    for start in range(0, len(ids), _SWEEP_BATCH):
        index_tasks.examples_index.delay(ids[start : start + _SWEEP_BATCH])


@shared_task(name="memory.examples_prune")
def examples_prune() -> None:
    """Periodic: retire low-utility examples in every queue (thresholds per queue)."""
    for queue in Queue.objects.all():
        curation.examples_prune(queue=queue)


# These two answer the management commands, through the worker that owns the store.
@shared_task(name="memory.check", ignore_result=False)
def memory_check(queue_slug: str | None = None) -> dict[str, Any]:
    return integrity.memory_check(queue_slug=queue_slug)


@shared_task(name="memory.reindex", ignore_result=False)
def memory_reindex(queue_slug: str | None = None) -> dict[str, Any]:
    return integrity.memory_reindex(queue_slug=queue_slug)
