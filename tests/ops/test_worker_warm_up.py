"""The worker's start-up, after which its first tasks and its collections are cheap."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_worker_freezes_what_it_loaded_at_start_out_of_the_collectors_reach() -> None:
    # In a fresh process, as a worker starts (the suite's own process must not freeze).
    # `consumer` is a test double of the Celery consumer: a worker of the default queue only.
    script = (
        "import gc, types, django; django.setup(); from django.conf import settings; "
        "from worker.app import warm_up; before = gc.get_freeze_count(); "
        "queue = types.SimpleNamespace(name=settings.CELERY_TASK_DEFAULT_QUEUE); "
        "consumer = types.SimpleNamespace(task_consumer=types.SimpleNamespace(queues=[queue])); "
        "warm_up(consumer); print(before, gc.get_freeze_count())"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"},
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )

    before, after = (int(count) for count in done.stdout.split()[-2:])
    # Django, Celery, litellm and the embedder: hundreds of thousands of objects.
    assert after - before > 100_000
