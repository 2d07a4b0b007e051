"""The Celery app: `celery -A worker worker` runs the worker; `celery -A worker beat`, the clock."""

import logging
import os
import sys

from celery import Celery
from celery.signals import worker_ready

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "icrlhf.settings")

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
        name="make the review items of gateway calls whose capture was lost",
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
        settings.CALIBRATION_REFIT_INTERVAL_S,
        sender.signature("review.calibrations_refit"),
        name="refit the confidence of queues with new decisions",
    )


@worker_ready.connect
def warm_up(**_: object) -> None:
    """Load the embedder and litellm now, so the first generation is not the slow one."""
    from icrlhf.integrations import embeddings, llm

    try:
        embeddings.warm_up()
        llm.warm_up()
    except Exception:  # A missing model must not stop the worker; tasks report it.
        logging.getLogger(__name__).exception("Warm-up failed")
