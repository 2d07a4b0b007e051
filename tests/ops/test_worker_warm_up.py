"""The worker's start-up, after which its first tasks and its collections are cheap."""

from tests.support.fresh_process import fresh_process_output


def test_the_worker_freezes_what_it_loaded_at_start_out_of_the_collectors_reach() -> None:
    # In a fresh process, as a worker starts (the suite's own process must not freeze).
    # `consumer` is a test double of the Celery consumer: a worker of the default queue only.
    output = fresh_process_output(
        "import gc, types; from django.conf import settings; "
        "from worker.app import warm_up; before = gc.get_freeze_count(); "
        "queue = types.SimpleNamespace(name=settings.CELERY_TASK_DEFAULT_QUEUE); "
        "consumer = types.SimpleNamespace(task_consumer=types.SimpleNamespace(queues=[queue])); "
        "warm_up(consumer); print(before, gc.get_freeze_count())"
    )

    before, after = (int(count) for count in output.split()[-2:])
    # Django, Celery, litellm and the embedder: hundreds of thousands of objects.
    assert after - before > 100_000
