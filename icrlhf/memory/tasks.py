from typing import Any

from celery import shared_task

from icrlhf.integrations.vectors import VectorStoreUnavailable
from icrlhf.memory import services

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
    services.examples_index(example_ids=example_ids)


@shared_task(name="memory.examples_unindex", **_STORE_RETRIES)
def examples_unindex(example_ids: list[str]) -> None:
    services.examples_unindex(example_ids=example_ids)


@shared_task(name="memory.examples_sweep")
def examples_sweep() -> None:
    """Periodic: re-enqueue whatever the index task has not stored (after an outage, a crash)."""
    ids = services.examples_unindexed()
    for start in range(0, len(ids), _SWEEP_BATCH):
        examples_index.delay(ids[start : start + _SWEEP_BATCH])
