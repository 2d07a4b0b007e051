"""What waiting for review's share of an endpoint costs (`bench_pipeline --waiting`): the
worker's CPU while 1, 10 and 100 generations wait in line on a held slot, and how soon the
first in line starts once the slot comes back.

The world has review's share at one call (REVIEW_GENERATION_MAX_CONCURRENT=1) and a model
endpoint that holds each call until the benchmark lets it go (`--hold` seconds at most): one
generation holds the slot for its whole call while the others join the line, however long
that takes on a slow machine, and the window is measured. Each level's first in line, woken
when the holder's call ends, holds the slot for the next level; the rest of each level are
called off (their candidates marked failed), so that the line drains.
"""

import time
import urllib.request
from typing import Any

import psutil
from django.conf import settings

from bench.world import world
from icrlhf.ops.stack import wait_until
from tests.support.fixed_latency_llm import FixedLatencyLLM


def outside(options: dict[str, Any]) -> dict[str, Any]:
    latency_s = options["hold"]
    llm = FixedLatencyLLM(latency_s=latency_s, held=True).start()
    try:
        with world(
            "bench-waiting",
            database_url=options["database_url"],
            LLM_API_BASE=llm.api_base,
            LLM_MODEL="openai/fixed-latency",
            REVIEW_GENERATION_MAX_CONCURRENT="1",
            # A held call must not time out: it would be retried, not ended.
            LLM_TIMEOUT_S=str(2 * latency_s),
        ) as here:
            worker = here.worker(concurrency=12)
            result = here.inside("bench_pipeline", {**options, "worker_pid": worker.process.pid})
            return {**result, "longest_hold_s": latency_s}
    finally:
        llm.stop()


def measure(options: dict[str, Any]) -> dict[str, Any]:
    """Runs inside the world: drives the product through its services."""
    from django.contrib.auth import get_user_model

    from icrlhf.generation.services import item_create
    from icrlhf.queues.models import Queue

    worker = psutil.Process(options["worker_pid"])
    reviewer = get_user_model().objects.create_user("bench-reviewer")

    def queue_of(slug: str) -> Queue:
        return Queue.objects.create(slug=slug, name=slug, n_candidates=1)

    holder = _candidate_of(
        item_create(queue=queue_of("holder"), input_text="Holder", created_by=reviewer)
    )
    levels = []
    for count in options["waiting"]:
        # Each in a queue of its own, so each is its queue's next, at the best fair priority:
        # the case where waiting cost most when generations asked again by themselves.
        items = [
            item_create(
                queue=queue_of(f"waiting-{count}-{n}"),
                input_text=f"Waiting {count}.{n}",
                created_by=reviewer,
            )
            for n in range(count)
        ]
        level, holder = _level(
            items, holder=holder, worker=worker, window_s=options["window"], hold_s=options["hold"]
        )
        levels.append(level)
    _model_release()  # the last level's first in line: its call ends, and the worker stops
    return {"mode": "waiting", "window_s": options["window"], "levels": levels}


def _candidate_of(item: Any) -> Any:
    from icrlhf.generation.models import Candidate

    found = Candidate.objects.filter(generation__item=item).first()
    assert found is not None
    return found


def _level(
    items: list[Any], *, holder: Any, worker: psutil.Process, window_s: float, hold_s: float
) -> tuple[dict[str, Any], Any]:
    """The worker's CPU while `items` wait in line behind one call holding the slot (the
    holder's, or, when one of them took the slot first, that one's); then the first in line
    is woken (and returned: it holds the slot next), the others called off."""
    from icrlhf.generation.models import Candidate

    level = [holder, *(_candidate_of(item) for item in items)]
    rows = Candidate.objects.filter(pk__in=[c.pk for c in level])
    calling = rows.filter(status=Candidate.Status.RUNNING)
    in_line = rows.filter(status=Candidate.Status.PENDING, retry_at__isnull=False)
    try:
        wait_until(
            lambda: calling.count() == 1 and in_line.count() == len(items),
            timeout_s=hold_s,  # held no longer, the holding call would end
            what="the line",
        )
    except RuntimeError as error:
        states = list(rows.values_list("status", "retry_at", "attempts"))
        raise RuntimeError(f"{error}: {states}") from error
    time.sleep(1.0)  # the last joins commit
    # The call holding the slot started first; a generation that asks again by itself is
    # claimed for a moment each time it asks (the code this measured against did).
    holding = calling.order_by("started_at").first()
    assert holding is not None
    before, opened = worker.cpu_times(), time.monotonic()
    time.sleep(window_s)
    after, closed = worker.cpu_times(), time.monotonic()
    busy_s = (after.user - before.user) + (after.system - before.system)
    held = calling.filter(pk=holding.pk).exists()
    # The first in line (the oldest: the line is in fair order) is kept: woken when the
    # holding call ends, it holds the slot for the next level. The others are called off:
    # woken, they claim nothing and pass the slot on.
    first, *others = in_line.order_by("pk")
    Candidate.objects.filter(pk__in=[c.pk for c in others]).update(
        status=Candidate.Status.FAILED, error="Called off by the benchmark."
    )
    _model_release()
    done = Candidate.objects.filter(pk=holding.pk, finished_at__isnull=False)
    wait_until(done.exists, timeout_s=60, what="the holding call to end")
    holding.refresh_from_db()
    woken = Candidate.objects.filter(
        pk=first.pk, status=Candidate.Status.RUNNING, started_at__gt=holding.finished_at
    )
    wait_until(woken.exists, timeout_s=60, what="the first in line to be woken")
    first.refresh_from_db()
    assert first.started_at is not None and holding.finished_at is not None
    return {
        "waiting": len(items),
        "worker_cpu_percent": round(100 * busy_s / (closed - opened), 2),
        "held_throughout": held,
        "woken_after_ms": round((first.started_at - holding.finished_at).total_seconds() * 1000, 1),
    }, first


def _model_release() -> None:
    """Lets the endpoint answer the call it holds (FixedLatencyLLM, held)."""
    request = urllib.request.Request(f"{settings.LLM_API_BASE}/release", data=b"", method="POST")
    with urllib.request.urlopen(request, timeout=10):
        pass
