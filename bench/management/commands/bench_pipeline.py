"""Pipeline benchmark: fan-out ratio, decision → retrievable latency, app overhead; with
`--local-model`, the time to a generation's first candidate and to all N on the real local
model; with `--waiting`, what waiting for review's share of an endpoint costs the worker
(bench/waiting.py).

The command sets up a throw-away world (SQLite file, Qdrant local folder, its own broker
queue), an OpenAI-compatible endpoint with a fixed 1 s latency (or the local llama.cpp
server), and a real Celery worker; then it re-runs itself inside that world (`--inner`) to
drive the product through its services.
"""

import statistics
import time
from datetime import datetime
from typing import Any

from django.conf import settings
from django.core.management.base import CommandParser

from bench import waiting
from bench.world import WorldCommand, add_llm_options, llm_endpoint, percentile, world
from icrlhf.ops.stack import wait_until
from tests.support.fixed_latency_llm import FixedLatencyLLM


def seconds_between(later: datetime | None, earlier: datetime | None) -> float:
    assert later is not None and earlier is not None
    return (later - earlier).total_seconds()


class Command(WorldCommand):
    help = "Measure fan-out, decision → retrievable latency and per-generation app overhead."

    def add_options(self, parser: CommandParser) -> None:
        parser.add_argument("--latency", type=float, default=1.0, help="LLM latency, seconds.")
        parser.add_argument("--generations", type=int, default=30, help="N=8 runs to time.")
        parser.add_argument("--decisions", type=int, default=50)
        parser.add_argument(
            "--flood",
            type=int,
            default=200,
            help="Items at N=8 flooding one queue while another queue's item is timed (0: skip).",
        )
        parser.add_argument(
            "--local-model",
            action="store_true",
            help="Time generations on the real local model (llama.cpp with LOCAL_LLM's model, "
            "LOCAL_LLM_SLOTS requests at once), or on --llm-api-base's, instead: to the first "
            "candidate and to all N.",
        )
        add_llm_options(parser)
        parser.add_argument("--sizes", default="1,4,8", help="N values for --local-model.")
        parser.add_argument("--repeats", type=int, default=5, help="Items per N, --local-model.")
        parser.add_argument(
            "--waiting",
            type=lambda value: [int(n) for n in value.split(",")],
            default=[],
            metavar="1,10,100",
            help="Instead: the worker's CPU while this many generations wait in line for "
            "review's share of an endpoint, one level after the other.",
        )
        parser.add_argument(
            "--window", type=float, default=10.0, help="Seconds the worker's CPU is measured."
        )
        parser.add_argument(
            "--hold",
            type=float,
            default=600.0,
            help="In --waiting, the model holds each call until the benchmark lets it go, once "
            "a level's items are in line and its window is measured: at most this many seconds.",
        )
        parser.add_argument(
            "--database-url",
            default="",
            help="A PostgreSQL server to run on, e.g. postgres://postgres@127.0.0.1:5432/test: "
            "a scratch database is created there and dropped after the run (default: the "
            "install's database kind; a temporary SQLite file for SQLite).",
        )

    def outside(self, options: dict[str, Any]) -> dict[str, Any]:
        if options["waiting"]:
            return waiting.outside(options)
        options["local_model"] |= bool(options["llm_api_base"])  # a real model, not the fixed one
        if options["local_model"]:
            return _local_model_outside(options)
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
        if options["waiting"]:
            return waiting.measure(options)
        return local_model_measure(options) if options["local_model"] else measure(options)

    def report(self, result: dict[str, Any], options: dict[str, Any]) -> None:
        if options["waiting"]:
            self._report_waiting(result)
            return
        if options["local_model"]:
            self._report_local_model(result)
            return
        lines = [
            f"LLM endpoint latency: {result['llm_latency_s']:.2f} s (one direct call: "
            f"{result['one_call_s']:.3f} s)",
            f"(a) fan-out ratio, N=8 wall ÷ one call: {result['fan_out_ratio']:.3f} "
            f"(median of {result['generations']} generations; target ≤ 1.05)",
            f"(b) decision → retrievable: p50 {result['decision_to_retrievable_p50_s']:.3f} s, "
            f"p95 {result['decision_to_retrievable_p95_s']:.3f} s over {result['decisions']} "
            "decisions (target p95 ≤ 1 s)",
            f"(c) app overhead per generation: p50 {result['overhead_p50_ms']:.1f} ms, "
            f"p95 {result['overhead_p95_ms']:.1f} ms (target p95 ≤ 40 ms on either database); "
            "of which item → "
            f"prompt ready (retrieval included): p50 {result['prepare_p50_ms']:.1f} ms, "
            f"p95 {result['prepare_p95_ms']:.1f} ms; prompt ready → last of the 8 calls started: "
            f"p50 {result['dispatch_p50_ms']:.1f} ms; after it, ranking the 8 (the item is "
            f"ready meanwhile): p50 {result['ranking_p50_ms']:.1f} ms",
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

    def _report_waiting(self, result: dict[str, Any]) -> None:
        self.stdout.write(
            "Waiting for review's share of an endpoint (1 call, held until the line formed): "
            f"the worker's CPU over {result['window_s']:.0f} s (target < 2% of a core)"
        )
        self.stdout.write(f"{'waiting':>7} | {'worker CPU':>10} | first in line woken after")
        for level in result["levels"]:
            held = "" if level["held_throughout"] else " (the slot came back within the window)"
            self.stdout.write(
                f"{level['waiting']:>7} | {level['worker_cpu_percent']:>8.2f} % | "
                f"{level['woken_after_ms']:.0f} ms{held}"
            )

    def _report_local_model(self, result: dict[str, Any]) -> None:
        slots = f", {result['slots']} requests decoded at once" if result["slots"] else ""
        self.stdout.write(
            f"Model: {result['model']}{slots}, "
            f"max_tokens {result['max_tokens']}; medians of {result['repeats']} items per N"
        )
        self.stdout.write(f"{'N':>3} | {'first candidate':>15} | {'all N':>8} | tokens/answer")
        for size, row in result["sizes"].items():
            self.stdout.write(
                f"{size:>3} | {row['first_s']:>13.2f} s | {row['all_s']:>6.2f} s | "
                f"{row['tokens_per_answer']:.0f}"
            )
        if "all_4_over_1" in result:
            self.stdout.write(
                f"All 4 ready in {result['all_4_over_1']:.2f}× the time of one (target ≤ 2×)"
            )


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


def _ranked(generation: Any) -> Any:
    """The generation, once its ranking is done."""
    from icrlhf.generation.models import Generation

    ranked = Generation.objects.filter(pk=generation.pk, ranked_at__isnull=False)
    wait_until(ranked.exists, timeout_s=60, what=f"ranking of generation {generation.pk}")
    generation.refresh_from_db()
    return generation


WARM_UP_GENERATIONS = 5


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
    # after a few that are not timed: the first waits for the worker to start, and the first
    # runs of each code path and connection were measured slower (a start-up cost, not a
    # generation's).
    wide = Queue.objects.create(slug="bench-fan-out", name="Fan-out", n_candidates=8)
    for number in range(WARM_UP_GENERATIONS):
        _ranked(
            _finished(item_create(queue=wide, input_text=f"Warm-up {number}", created_by=reviewer))
        )
    walls, overheads, prepares, dispatches, rankings = [], [], [], [], []
    for number in range(options["generations"]):
        item = item_create(
            queue=wide, input_text=f"Question {number}: where is my card?", created_by=reviewer
        )
        # Ranking follows (it embeds the answers): the next generation starts once it is
        # done, so that each one is timed on an idle worker; the ranking is timed apart.
        generation = _ranked(_finished(item))
        assert generation.ranked_at is not None and generation.finished_at is not None
        rankings.append(seconds_between(generation.ranked_at, generation.finished_at) * 1000)
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
    # Decided once their rankings are done (they embed too), as in part (c).
    unranked = Generation.objects.filter(item__in=items, ranked_at__isnull=True)
    wait_until(lambda: not unranked.exists(), timeout_s=120, what="the rankings")
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
        if example.decision is not None  # every one here: all come from decisions
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
        "ranking_p50_ms": percentile(rankings, 50),
        # Each generation's, in order: a p95 of a few is its slowest ones, which these show.
        "overhead_samples_ms": [round(overhead, 1) for overhead in overheads],
        "prepare_samples_ms": [round(prepare, 1) for prepare in prepares],
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


LOCAL_MODEL_MAX_TOKENS = 100


def _local_model_outside(options: dict[str, Any]) -> dict[str, Any]:
    with (
        llm_endpoint(options, slots=settings.LOCAL_LLM_SLOTS) as llm,
        world("bench-pipeline-local", database_url=options["database_url"], **llm) as here,
    ):
        here.worker(concurrency=4)
        return dict(here.inside("bench_pipeline", options))


def local_model_measure(options: dict[str, Any]) -> dict[str, Any]:
    """Items one after another at each N, on an otherwise idle worker and model: from the
    item's creation to its first candidate saved, and to its generation finished."""
    from django.contrib.auth import get_user_model

    from icrlhf.generation.services import item_create
    from icrlhf.queues.models import Queue

    reviewer = get_user_model().objects.create_user("bench-reviewer")
    queue = Queue.objects.create(
        slug="bench-local",
        name="Local model",
        # Answers long enough to reach max_tokens, so every N compares answers of one length.
        system_prompt="You are a bank's support agent. Answer at length, in at least 200 words.",
        max_tokens=LOCAL_MODEL_MAX_TOKENS,
    )
    _finished(item_create(queue=queue, input_text="Warm-up", created_by=reviewer, n_candidates=1))
    sizes: dict[str, dict[str, float]] = {}
    for size in [int(n) for n in options["sizes"].split(",")]:
        firsts, alls, tokens = [], [], []
        for number in range(options["repeats"]):
            item = item_create(
                queue=queue,
                input_text=f"Question {number}: my card payment was declined twice. Explain in "
                "detail every possible reason and what I should do about each one.",
                created_by=reviewer,
                n_candidates=size,
            )
            generation = _finished(item)
            candidates = list(generation.candidates.all())
            first = min(c.finished_at for c in candidates if c.finished_at is not None)
            firsts.append(seconds_between(first, item.created_at))
            alls.append(seconds_between(generation.finished_at, item.created_at))
            tokens += [c.completion_tokens or 0 for c in candidates]
        sizes[str(size)] = {
            "first_s": statistics.median(firsts),
            "all_s": statistics.median(alls),
            "tokens_per_answer": statistics.mean(tokens),
        }
    result: dict[str, Any] = {
        "mode": "local-model",
        "model": settings.LLM_MODEL
        if options["llm_api_base"]
        else settings.LOCAL_LLM_MODEL_PATH.name,
        "slots": None if options["llm_api_base"] else settings.LOCAL_LLM_SLOTS,
        "max_tokens": LOCAL_MODEL_MAX_TOKENS,
        "repeats": options["repeats"],
        "sizes": sizes,
    }
    if "1" in sizes and "4" in sizes:
        result["all_4_over_1"] = sizes["4"]["all_s"] / sizes["1"]["all_s"]
    return result
