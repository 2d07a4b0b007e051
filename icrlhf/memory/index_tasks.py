"""The vector store's writes (`index`) as tasks of the memory queue: what services and
curation enqueue once their transaction commits, and the worker that owns the store runs."""

# Celery's task decorators carry no types: pyproject.toml's excuse for `icrlhf.*.tasks`.
# mypy: disallow-untyped-decorators=False

from typing import Any

from celery import shared_task

from icrlhf.integrations.vectors import VectorStoreUnavailable
from icrlhf.memory import index

# The store may be down for a while (a restart, a network blip): retry with backoff, and the
# sweeper (`tasks.examples_sweep`) picks up whatever still fails after that.
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


@shared_task(name="memory.examples_payload_sync", **_STORE_RETRIES)
def examples_payload_sync(example_ids: list[str]) -> None:
    index.examples_payload_sync(example_ids=example_ids)


@shared_task(name="memory.examples_points_delete", **_STORE_RETRIES)
def examples_points_delete(collection: str, point_ids: list[str]) -> None:
    index.points_delete(collection=collection, point_ids=point_ids)
