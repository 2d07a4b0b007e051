"""The Celery app: `celery -A worker worker` runs the worker; `celery -A worker beat`, the clock."""

import gc
import logging
import os
import sys
from typing import TYPE_CHECKING, Any

from celery import Celery, Task
from celery.signals import task_prerun, worker_ready, worker_shutdown

if TYPE_CHECKING:
    from icrlhf.integrations.local_socket import RoundServer

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "icrlhf.settings")
# numpy's OpenBLAS starts a thread per core for a large enough product (the embedded store's
# search at 10k points is one) and its threads spin between calls: in processes that already
# run a thread per request, that took cores from the rest. Read once, when numpy loads.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

# The worker's threads mostly wait on the LLM; a shorter GIL switch interval lets a thread
# whose answer arrived run sooner instead of waiting out another thread's 5 ms slice.
sys.setswitchinterval(0.001)

app = Celery("icrlhf")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@app.on_after_finalize.connect
def schedule_periodic_tasks(sender: Celery, **_: object) -> None:
    from django.conf import settings

    sender.add_periodic_task(
        settings.GENERATION_SWEEP_INTERVAL_S,
        sender.signature("generation.sweep"),
        name="re-enqueue generations a dead worker or a lost message left behind",
    )
    sender.add_periodic_task(
        settings.GENERATION_SWEEP_INTERVAL_S,
        sender.signature("gateway.captures_sweep"),
        name="write the call log's rows no gateway is writing; capture what was not captured",
    )
    sender.add_periodic_task(
        settings.MEMORY_SWEEP_INTERVAL_S,
        sender.signature("memory.examples_sweep"),
        name="re-index examples still pending or failed",
    )
    sender.add_periodic_task(
        settings.MEMORY_PRUNE_INTERVAL_S,
        sender.signature("memory.examples_prune"),
        name="retire low-utility examples",
    )
    sender.add_periodic_task(
        settings.CALL_PURGE_INTERVAL_S,
        sender.signature("gateway.calls_purge"),
        name="remove what end users wrote from gateway calls past CALL_RETENTION_DAYS",
    )
    sender.add_periodic_task(
        settings.REFLECTION_CHECK_INTERVAL_S,
        sender.signature("reflection.reflect_due"),
        name="reflect on the playbooks of queues with enough new decisions the first lost",
    )
    sender.add_periodic_task(
        settings.CALIBRATION_REFIT_INTERVAL_S,
        sender.signature("review.calibrations_refit"),
        name="refit the confidence of queues with new decisions",
    )


_recall_server: "RoundServer | None" = None


@worker_ready.connect
def warm_up(sender: Any, **_: object) -> None:
    """Load the embedder and litellm now, and open the vector store in the worker that owns
    it (the memory queue's: local mode admits one process), so no first task is the slow one.
    That worker also answers other processes' retrievals over its socket."""
    from django.conf import settings

    from icrlhf.generation import tasks as generation_tasks
    from icrlhf.integrations import embeddings, llm, vectors
    from icrlhf.memory.recall_owner import recall_server

    global _recall_server
    consumed = {queue.name for queue in sender.task_consumer.queues}
    memory_worker = settings.CELERY_MEMORY_QUEUE in consumed
    # Its prepare tasks generate their candidates themselves: the broker would only hand
    # them to another thread of this same pool.
    generation_tasks.fan_out_inline = (
        memory_worker and settings.CELERY_TASK_DEFAULT_QUEUE in consumed
    )
    try:
        embeddings.warm_up()
        llm.warm_up()
        if memory_worker:
            vectors.warm_up()
    except Exception:  # A missing model or store must not stop the worker; tasks report it.
        logging.getLogger(__name__).exception("Warm-up failed")
    if memory_worker and not settings.QDRANT_URL:  # the embedded store is this process's
        try:
            _recall_server = recall_server()
            _recall_server.start()
        except Exception:
            logging.getLogger(__name__).exception("Retrievals cannot be answered")
    # What is loaded by now (the libraries, the embedder, the store's points) lives as long
    # as the worker: out of the collector's reach, a full collection no longer scans it all.
    # Such a collection stopped every thread of the worker for 261 ms during a flood of
    # generations (bench_pipeline's fairness run, 2 cores); frozen, it took 8 ms. Collected
    # first: garbage frozen with it would never be freed.
    gc.collect()
    gc.freeze()


@worker_shutdown.connect
def recall_server_stopped(**_: object) -> None:
    if _recall_server is not None:
        _recall_server.stop()


@task_prerun.connect
def connections_checked(task: Task, **_: object) -> None:
    """A connection kept from an earlier task (CELERY_DB_REUSE_MAX) is health-checked before
    its first query, and replaced if it went bad. Not for a task run inline (eager): it runs
    inside its caller's transaction."""
    from django.db import close_old_connections

    if not task.request.is_eager:
        close_old_connections()
