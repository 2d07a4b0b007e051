"""Pipeline benchmark: fan-out ratio, decision → retrievable latency, app overhead.

The command sets up a throw-away world (SQLite file, Qdrant local folder, its own broker
queue), an OpenAI-compatible endpoint with a fixed 1 s latency, and a real Celery worker; then
it re-runs itself inside that world (`--inner`) to drive the product through its services.
"""

import statistics
import time
from datetime import datetime
from typing import Any

from django.conf import settings
from django.core.management.base import CommandParser

from bench.world import WorldCommand, percentile, world
from icrlhf.ops.stack import wait_until
from tests.support.fixed_latency_llm import FixedLatencyLLM


def seconds_between(later: datetime | None, earlier: datetime | None) -> float:
    assert later is not None and earlier is not None
    return (later - earlier).total_seconds()


class Command(WorldCommand):
    help = "Measure fan-out, decision → retrievable latency and per-generation app overhead."

    def add_options(self, parser: CommandParser) -> None:
        parser.add_argument("--latency", type=float, default=1.0, help="LLM latency, seconds.")
        parser.add_argument("--generations", type=int, default=15, help="N=8 runs to time.")
        parser.add_argument("--decisions", type=int, default=50)
        parser.add_argument(
            "--flood",
            type=int,
            default=200,
            help="Items at N=8 flooding one queue while another queue's item is timed (0: skip).",
        )
        parser.add_argument(
            "--database-url",
            default="",
            help="A PostgreSQL server to run on, e.g. postgres://postgres@127.0.0.1:5432/test: "
            "a scratch database is created there and dropped after the run (default: the "
            "install's database kind; a temporary SQLite file for SQLite).",
        )

    def outside(self, options: dict[str, Any]) -> dict[str, Any]:
        llm = FixedLatencyLLM(latency_s=options["latency"]).start()
        try:
            with world(
                "bench-pipeline",
                database_url=options["database_url"],
                LLM_API_BASE=llm.api_base,
                LLM_MODEL="openai/fixed-latency",
            ) as here:
                here.worker(concurrency=12)
                return dict(here.inside("bench_pipeline", options))
        finally:
            llm.stop()

    def measure(self, options: dict[str, Any]) -> dict[str, Any]:
        return measure(options)

    def report(self, result: dict[str, Any], options: dict[str, Any]) -> None:
        lines = [
            f"LLM endpoint latency: {result['llm_latency_s']:.2f} s (one direct call: "
            f"{result['one_call_s']:.3f} s)",
            f"(a) fan-out ratio, N=8 wall ÷ one call: {result['fan_out_ratio']:.3f} "
            f"(median of {result['generations']} generations; target ≤ 1.25)",
            f"(b) decision → retrievable: p50 {result['decision_to_retrievable_p50_s']:.3f} s, "
            f"p95 {result['decision_to_retrievable_p95_s']:.3f} s over {result['decisions']} "
            "decisions (target p95 ≤ 1 s)",
            f"(c) app overhead per generation: p50 {result['overhead_p50_ms']:.1f} ms, "
            f"p95 {result['overhead_p95_ms']:.1f} ms (target p95 ≤ 100 ms); of which item → "
            f"prompt ready (retrieval included): p50 {result['prepare_p50_ms']:.1f} ms, "
            f"p95 {result['prepare_p95_ms']:.1f} ms; prompt ready → last of the 8 calls started: "
            f"p50 {result['dispatch_p50_ms']:.1f} ms",
        ]
        if "fair_ratio" in result:
            lines.append(
                f"(d) fairness: with {result['flood_items']} items at N=8 flooding one queue "
                f"({result['flood_left_unfinished']} still unfinished), another queue's item "
                f"took {result['fair_wall_s']:.2f} s, {result['fair_ratio']:.2f}× its time on "
                "the idle system (target ≤ 2×)"
            )
        for line in lines:
            self.stdout.write(line)


def _finished(item: Any, timeout_s: float = 120) -> Any:
    """The item's generation, once the item is ready for review."""
    from icrlhf.generation.models import Generation
    from icrlhf.queues.models import Item

    wait_until(
        lambda: Item.objects.filter(pk=item.pk, status=Item.Status.READY).exists(),
        timeout_s=timeout_s,
        what=f"item {item.pk}",
    )
    return Generation.objects.get(item=item)


def measure(options: dict[str, Any]) -> dict[str, Any]:
    """Runs inside the benchmark's world: drives the product through its services."""
    from django.contrib.auth import get_user_model

    from icrlhf.generation.models import Generation
    from icrlhf.generation.services import item_create
    from icrlhf.integrations import llm
    from icrlhf.memory.models import Example
    from icrlhf.queues.models import Queue
    from icrlhf.review.decisions import decision_record

    reviewer = get_user_model().objects.create_user("bench-reviewer")
    messages = [{"role": "user", "content": "ping"}]
    llm.complete(messages=messages, model=settings.LLM_MODEL, params={})  # warm the client
    started = time.monotonic()
    llm.complete(messages=messages, model=settings.LLM_MODEL, params={})
    one_call_s = time.monotonic() - started

    # (a) and (c): N=8 generations one after another, timed from the database's own clocks,
    # after one that is not timed (it waits for the worker to start).
    wide = Queue.objects.create(slug="bench-fan-out", name="Fan-out", n_candidates=8)
    _finished(item_create(queue=wide, input_text="Warm-up", created_by=reviewer))
    walls, overheads, prepares, dispatches = [], [], [], []
    for number in range(options["generations"]):
        item = item_create(
            queue=wide, input_text=f"Question {number}: where is my card?", created_by=reviewer
        )
        generation = _finished(item)
        wall = seconds_between(generation.finished_at, item.created_at)
        llm_s = max(c.latency_ms or 0 for c in generation.candidates.all()) / 1000
        walls.append(wall)
        overheads.append((wall - llm_s) * 1000)
        prepares.append(seconds_between(generation.prepared_at, item.created_at) * 1000)
        last_start = max(c.started_at or item.created_at for c in generation.candidates.all())
        dispatches.append(seconds_between(last_start, generation.prepared_at) * 1000)

    # (b): decisions on ready items; retrievable = upserted into the store (wait=True).
    narrow = Queue.objects.create(slug="bench-decisions", name="Decisions", n_candidates=2)
    items = [
        item_create(
            queue=narrow, input_text=f"Request {n} about a card payment", created_by=reviewer
        )
        for n in range(options["decisions"])
    ]
    for item in items:
        _finished(item)
    preferred_ids = []
    for item in items:
        candidate = Generation.objects.get(item=item).candidates.first()
        assert candidate is not None
        decision = decision_record(
            item_id=item.pk, reviewer=reviewer, verdict="chosen", candidate_id=candidate.pk
        )
        preferred_ids.append(decision.examples.get(role=Example.Role.PREFERRED).pk)
        time.sleep(0.05)
    wait_until(
        lambda: not Example.objects.exclude(index_state=Example.IndexState.INDEXED).exists(),
        timeout_s=120,
        what="indexing",
    )
    latencies = [
        seconds_between(example.indexed_at, example.decision.created_at)
        for example in Example.objects.filter(pk__in=preferred_ids).select_related("decision")
    ]
    fairness = _fairness(options, reviewer=reviewer, idle_wall_s=statistics.median(walls))
    return {
        **fairness,
        "llm_latency_s": options["latency"],
        "one_call_s": one_call_s,
        "generations": len(walls),
        "fan_out_ratio": statistics.median(walls) / one_call_s,
        "fan_out_wall_p50_s": statistics.median(walls),
        "decisions": len(latencies),
        "decision_to_retrievable_p50_s": percentile(latencies, 50),
        "decision_to_retrievable_p95_s": percentile(latencies, 95),
        "overhead_p50_ms": percentile(overheads, 50),
        "overhead_p95_ms": percentile(overheads, 95),
        "prepare_p50_ms": percentile(prepares, 50),
        "prepare_p95_ms": percentile(prepares, 95),
        "dispatch_p50_ms": percentile(dispatches, 50),
    }


def _fairness(options: dict[str, Any], *, reviewer: Any, idle_wall_s: float) -> dict[str, Any]:
    """(d): one queue flooded with `--flood` items at N=8, then one item in another queue:
    its wall time against the same item's on the idle system (the median of (a))."""
    from icrlhf.generation.models import Candidate, Generation
    from icrlhf.generation.services import item_create
    from icrlhf.generation.tasks import broker_backlog
    from icrlhf.queues.models import Queue

    if not options["flood"]:
        return {}
    flooded = Queue.objects.create(slug="bench-flood", name="Flood", n_candidates=8)
    for number in range(options["flood"]):
        item_create(queue=flooded, input_text=f"Flood {number}", created_by=reviewer)
    time.sleep(2 * options["latency"])  # the worker is deep in the flood
    other = Queue.objects.create(slug="bench-other", name="Other", n_candidates=8)
    item = item_create(queue=other, input_text="Where is my card?", created_by=reviewer)
    generation = _finished(item, timeout_s=600)
    wall = seconds_between(generation.finished_at, item.created_at)
    unfinished = Generation.objects.filter(item__queue=flooded).exclude(
        status__in=[Generation.Status.DONE, Generation.Status.FAILED]
    )
    left = unfinished.count()
    # Call the flood off: its queued tasks then claim nothing and the broker drains.
    Candidate.objects.filter(
        generation__item__queue=flooded, status=Candidate.Status.PENDING
    ).update(status=Candidate.Status.FAILED, error="Called off by the benchmark.")
    unfinished.update(status=Generation.Status.FAILED)
    wait_until(lambda: broker_backlog() == 0, timeout_s=300, what="the flood to drain")
    return {
        "flood_items": options["flood"],
        "flood_left_unfinished": left,
        "fair_wall_s": wall,
        "fair_ratio": wall / idle_wall_s,
    }
