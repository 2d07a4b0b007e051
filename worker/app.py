"""The Celery app: `celery -A worker worker` runs the worker, `celery -A worker beat` the schedule."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "icrlhf.settings")

app = Celery("icrlhf")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@app.on_after_finalize.connect
def schedule_periodic_tasks(sender: Celery, **_: object) -> None:
    from django.conf import settings

    sender.add_periodic_task(
        settings.MEMORY_SWEEP_INTERVAL_S, sender.signature("memory.examples_sweep"),
        name="re-index examples still pending or failed",
    )
