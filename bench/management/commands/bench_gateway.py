"""Gateway benchmark: what the OpenAI-compatible endpoint adds to an upstream call, how fast it
answers from memory, and how many calls a second it carries, beside LiteLLM's proxy.

A throw-away world (SQLite file, or a scratch PostgreSQL database; Qdrant local folder; its
own broker queue) holds two queues with 1k and 10k preferred examples, embedded by the real
model from Banking77's requests. The real worker (which owns the embedded store and answers
the gateway's retrievals) and the real gateway process (uvicorn) run against an
OpenAI-compatible endpoint with a fixed latency. hey, a compiled load generator, first sends
32 calls at once to the gateway just started (its start-up burst), then calls it 1 and 32 at a
time, with a paraphrased request (the upstream answers) and with a stored request on a queue
that answers from memory; then, with the same body, the upstream alone and LiteLLM's proxy in
front of it.

Overhead = the time the call took, less the upstream's fixed latency: retrieval, the prompt,
the database, the HTTP layers, and what the upstream itself adds (measured alone). The call
log gives the retrieval times and which calls memory answered. A run of more than one client
is also split into its first burst (the first `clients` calls to start, which arrive together)
and its steady state (the rest), as the burst's queueing makes the tail."""

import csv
import statistics
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.core.management.base import CommandParser

from bench import litellm_proxy, loadgen
from bench.world import World, WorldCommand, percentile, world
from tests.support.fixed_latency_llm import FixedLatencyLLM

SIZES = (1_000, 10_000)
CLIENTS = (1, 32)
_BATCH = 500
# A stored request's own text scores ~1.0: well above this, so every such call is answered
# from memory; paraphrases (the other calls) stay below it and go to the model.
_MEMORY_THRESHOLD = 0.97
_UPSTREAM_MODEL = "openai/fixed-latency"


class Command(WorldCommand):
    help = "Measure the gateway's overhead, its memory answers and its throughput."

    def add_options(self, parser: CommandParser) -> None:
        parser.add_argument("--latency", type=float, default=1.0, help="Upstream latency, s.")
        parser.add_argument(
            "--calls-per-client", type=int, default=10, help="Calls each client makes per run."
        )
        parser.add_argument(
            "--sizes", default="1000,10000", help="Preferred examples per queue, comma-separated."
        )
        parser.add_argument("--database-url", default="", help="As for bench_pipeline.")
        parser.add_argument(
            "--no-litellm",
            dest="litellm",
            action="store_false",
            help="Do not measure LiteLLM's proxy beside the gateway.",
        )
        parser.add_argument(
            "--recall-timeout",
            type=float,
            default=settings.GATEWAY_RECALL_TIMEOUT_S,
            help="GATEWAY_RECALL_TIMEOUT_S for the gateway under test, s.",
        )

    def outside(self, options: dict[str, Any]) -> dict[str, Any]:
        loadgen.hey_path()  # before anything starts: say at once what is missing
        upstream = FixedLatencyLLM(latency_s=options["latency"]).start()
        try:
            with world(
                "bench-gateway",
                database_url=options["database_url"],
                LLM_API_BASE=upstream.api_base,
                LLM_MODEL=_UPSTREAM_MODEL,
                GATEWAY_RECALL_TIMEOUT_S=str(options["recall_timeout"]),
            ) as here:
                seeded = here.inside("bench_gateway", {**options, "phase": "seed"})
                here.worker(concurrency=8)
                _, gateway = here.gateway()
                litellm = (
                    litellm_proxy.start(
                        here.stack,
                        upstream_api_base=upstream.api_base,
                        upstream_model=_UPSTREAM_MODEL,
                        folder=here.folder,
                    )
                    if options["litellm"]
                    else None
                )
                return _measured(
                    here, seeded, options, gateway=gateway, upstream=upstream, litellm=litellm
                )
        finally:
            upstream.stop()

    def measure(self, options: dict[str, Any]) -> dict[str, Any]:
        if options["phase"] == "logged":
            return _logged(options["slug"], options["since"])
        if options["phase"] == "threshold":
            from icrlhf.queues.models import Queue

            # A curator's setting, changed between runs; the gateway reads it on every call.
            Queue.objects.filter(slug=options["slug"]).update(
                memory_answer_threshold=options["threshold"]
            )
            return {}
        return _seed([int(size) for size in options["sizes"].split(",")])

    def report(self, result: dict[str, Any], options: dict[str, Any]) -> None:
        for key, figures in result["runs"].items():
            self.stdout.write(
                f"{key}: overhead p50 {figures['overhead_p50_ms']:.1f} ms, "
                f"p95 {figures['overhead_p95_ms']:.1f} ms; retrieval p50 "
                f"{figures['retrieval_p50_ms']:.1f} ms; {figures['throughput_rps']:.1f} calls/s; "
                f"{figures['errors']} errors"
            )
        for key, figures in result["memory"].items():
            self.stdout.write(
                f"{key}: answer from memory p50 {figures['latency_p50_ms']:.1f} ms, "
                f"p95 {figures['latency_p95_ms']:.1f} ms; {figures['throughput_rps']:.1f} "
                f"calls/s; {figures['errors']} errors"
            )
        startup = result["startup_burst"]
        self.stdout.write(
            f"start-up burst, 32 clients: overhead p50 {startup['overhead_p50_ms']:.1f} ms, "
            f"p95 {startup['overhead_p95_ms']:.1f} ms, p99 {startup['overhead_p99_ms']:.1f} ms; "
            f"{startup['errors']} errors"
        )
        self.stdout.write(
            f"32 clients, biggest queue: overhead p95 of the first burst "
            f"{result['first_burst_overhead_p95_ms_10k_32']:.1f} ms, of the steady state "
            f"{result['steady_overhead_p95_ms_10k_32']:.1f} ms (p99 "
            f"{result['steady_overhead_p99_ms_10k_32']:.1f} ms); memory answers p99 "
            f"{result['memory_answer_p99_ms_32']:.1f} ms"
        )
        upstream = result["upstream_overhead_p95_ms_32"]
        self.stdout.write(f"the upstream alone, 32 clients: overhead p95 {upstream:.1f} ms")
        if "litellm" in result:
            theirs = result["litellm"]
            self.stdout.write(
                f"LiteLLM's proxy, 32 clients: overhead p50 {theirs['overhead_p50_ms']:.1f} ms, "
                f"p95 {theirs['overhead_p95_ms']:.1f} ms; {theirs['throughput_rps']:.1f} "
                f"calls/s; {theirs['errors']} errors"
            )
        ratio = result.get("overhead_ratio_vs_litellm_32")
        self.stdout.write(
            f"Targets: overhead p95 at 32 clients {result['overhead_p95_ms_10k_32']:.1f} ms "
            f"(≤ LiteLLM's: ratio {'n/a' if ratio is None else f'{ratio:.2f}'}, ≤ 1); "
            f"memory answers p95 {result['memory_answer_p95_ms']:.1f} ms at 1 client (≤ 10), "
            f"{result['memory_answers_per_s_32']:.0f} a second at 32 (≥ 300); throughput at 32 "
            f"clients {result['throughput_rps_32']:.1f} calls/s (≥ 30)"
        )


def _label(size: int) -> str:
    return f"{size / 1000:g}k"


def _texts() -> list[tuple[str, str]]:
    path = settings.SHARED_DATA_DIR / "banking77" / "test.csv"
    with path.open(newline="") as stream:
        return [(row["text"], row["category"]) for row in csv.DictReader(stream)]


def _seed(sizes: list[int]) -> dict[str, Any]:
    """Queues of `size` preferred examples each, indexed with real embeddings (this process
    owns the store until the worker starts), and a token for each."""
    from django.contrib.auth.models import User

    from icrlhf.generation.models import Generation
    from icrlhf.ingest.services import token_create
    from icrlhf.memory import index
    from icrlhf.memory.models import Example
    from icrlhf.queues.models import Item, Queue
    from icrlhf.review.models import Decision

    texts = _texts()
    reviewer = User.objects.create_user("bench-reviewer")
    seeded: dict[str, Any] = {"queues": {}}
    for size in sizes:
        slug = f"bench-{_label(size)}"
        queue = Queue.objects.create(slug=slug, name=slug)
        item = Item.objects.create(queue=queue, input_text="seed", status="decided")
        generation = Generation.objects.create(item=item, model="seed", n_candidates=1)
        decision = Decision.objects.create(
            item=item,
            generation=generation,
            reviewer=reviewer,
            verdict="none_acceptable",  # a row to hang the examples on, as in bench_curation
            guideline_version=1,
        )
        # Stored requests: Banking77's, numbered to make 10k distinct ones.
        for start in range(0, size, _BATCH):
            rows = [
                Example(
                    id=uuid.uuid4(),
                    queue=queue,
                    decision=decision,
                    input_text=f"{texts[n % len(texts)][0]} (#{n})",
                    output_text=f"This is about {texts[n % len(texts)][1]}.",
                    reward=1.0,
                    role="preferred",
                )
                for n in range(start, min(size, start + _BATCH))
            ]
            Example.objects.bulk_create(rows)
            index.examples_index(example_ids=[r.id for r in rows], neighbours=False)
        stored = Example.objects.filter(queue=queue).order_by("?")  # one, asked of memory
        seeded["queues"][slug] = {
            "size": size,
            "token": token_create(queue=queue, name="bench")[1],
            "stored": stored.values_list("input_text", flat=True).first(),
        }
    return seeded


def _measured(
    here: World,
    seeded: dict[str, Any],
    options: dict[str, Any],
    *,
    gateway: str,
    upstream: FixedLatencyLLM,
    litellm: str | None,
) -> dict[str, Any]:
    """hey against the gateway: first 32 calls at once on the biggest queue, as the process
    just started; then queue by queue, 1 then 32 clients at a time; then, with the same body,
    against the upstream alone and against LiteLLM's proxy in front of it."""
    latency_ms = options["latency"] * 1000
    question = _texts()[0][0]  # a paraphrase: no stored request is near enough to answer it
    runs: dict[str, Any] = {}
    memory: dict[str, Any] = {}
    biggest_queue = max(seeded["queues"].items(), key=lambda slug_queue: slug_queue[1]["size"])
    biggest = _label(biggest_queue[1]["size"])

    # Before any other call, and with no warm-up: the runs below warm the process with calls
    # from one client before 32 arrive, which a gateway just (re)started under load is not.
    # Only one such burst per process, so only for the paraphrase.
    startup_load = loadgen.post(
        f"{gateway}/chat/completions",
        {"model": biggest_queue[0], "messages": [{"role": "user", "content": question}]},
        calls=32,
        clients=32,
        headers={"Authorization": f"Bearer {biggest_queue[1]['token']}"},
    )
    startup = _whole(startup_load, latency_ms=latency_ms)

    def measured(slug: str, token: str, text: str, clients: int) -> dict[str, Any]:
        body = {"model": slug, "messages": [{"role": "user", "content": text}]}
        headers = {"Authorization": f"Bearer {token}"}
        url = f"{gateway}/chat/completions"
        loadgen.post(url, body, calls=clients, clients=clients, headers=headers)  # warm
        since = time.time()
        calls = clients * options["calls_per_client"]
        load = loadgen.post(url, body, calls=calls, clients=clients, headers=headers)
        logged: dict[str, Any] = here.inside(
            "bench_gateway", {**options, "phase": "logged", "slug": slug, "since": since}
        )
        return _figures(load, latency_ms=latency_ms) | logged

    def threshold_set(slug: str, threshold: float | None) -> None:
        here.inside(
            "bench_gateway", {**options, "phase": "threshold", "slug": slug, "threshold": threshold}
        )

    for slug, queue in seeded["queues"].items():
        label = _label(queue["size"])
        for clients in CLIENTS:
            runs[f"{label}_{clients}"] = measured(slug, queue["token"], question, clients)
        threshold_set(slug, _MEMORY_THRESHOLD)
        for clients in CLIENTS:
            memory[f"{label}_{clients}"] = measured(slug, queue["token"], queue["stored"], clients)
        threshold_set(slug, None)
    ours = runs[f"{biggest}_32"]
    result = {
        "runs": runs,
        "memory": memory,
        "overhead_p95_ms_10k_32": ours["overhead_p95_ms"],
        "memory_answer_p95_ms": memory[f"{biggest}_1"]["latency_p95_ms"],
        "memory_answer_p95_ms_32": memory[f"{biggest}_32"]["latency_p95_ms"],
        "memory_answer_p99_ms_32": memory[f"{biggest}_32"]["latency_p99_ms"],
        "memory_answers_per_s_32": memory[f"{biggest}_32"]["throughput_rps"],
        "throughput_rps_32": ours["throughput_rps"],
        "startup_burst": startup,
        "startup_burst_overhead_p95_ms": startup["overhead_p95_ms"],
        "first_burst_overhead_p95_ms_10k_32": ours["first_burst"]["overhead_p95_ms"],
        "steady_overhead_p95_ms_10k_32": ours["steady"]["overhead_p95_ms"],
        "steady_overhead_p99_ms_10k_32": ours["steady"]["overhead_p99_ms"],
    }
    calls = 32 * options["calls_per_client"]
    body = {"model": "fixed-latency", "messages": [{"role": "user", "content": question}]}
    alone = loadgen.post(f"{upstream.api_base}/chat/completions", body, calls=calls, clients=32)
    result["upstream_overhead_p95_ms_32"] = _figures(alone, latency_ms=latency_ms)[
        "overhead_p95_ms"
    ]
    if litellm is not None:
        body["model"] = litellm_proxy.MODEL
        headers = {"Authorization": f"Bearer {litellm_proxy.MASTER_KEY}"}
        url = f"{litellm}/chat/completions"
        loadgen.post(url, body, calls=32, clients=32, headers=headers)  # warm
        theirs = _figures(
            loadgen.post(url, body, calls=calls, clients=32, headers=headers), latency_ms=latency_ms
        )
        result["litellm"] = theirs
        result["litellm_overhead_p95_ms_32"] = theirs["overhead_p95_ms"]
        result["overhead_ratio_vs_litellm_32"] = ours["overhead_p95_ms"] / theirs["overhead_p95_ms"]
    return result


def _figures(load: loadgen.Load, *, latency_ms: float) -> dict[str, Any]:
    """The run's figures and, with more than one client, the same for its first burst and its
    steady state apart: the first burst's queueing is most of a short run's tail."""
    figures = _whole(load, latency_ms=latency_ms)
    if load.clients > 1:
        for part, walls in zip(
            ("first_burst", "steady"), load.first_burst_and_steady(), strict=True
        ):
            # A part's `calls` are its answered calls, the ones its figures are of.
            figures[part] = {"calls": len(walls), **_percentiles(walls, latency_ms=latency_ms)}
    return figures


def _whole(load: loadgen.Load, *, latency_ms: float) -> dict[str, Any]:
    """The figures of every call of a run."""
    walls = load.answered_ms
    return {
        "calls": load.calls,
        "errors": load.errors,
        "throughput_rps": len(walls) / load.elapsed_s if load.elapsed_s else 0.0,
        **_percentiles(walls, latency_ms=latency_ms),
    }


def _percentiles(walls: list[float], *, latency_ms: float) -> dict[str, Any]:
    """Overhead: the time a call took, less the upstream's fixed latency (so it includes what
    the upstream itself adds: `upstream_overhead_p95_ms_32` measures that alone)."""
    overheads = [wall - latency_ms for wall in walls]
    return {
        "latency_p50_ms": statistics.median(walls) if walls else float("nan"),
        "latency_p95_ms": percentile(walls, 95),
        "latency_p99_ms": percentile(walls, 99),
        "overhead_p50_ms": statistics.median(overheads) if overheads else float("nan"),
        "overhead_p95_ms": percentile(overheads, 95),
        "overhead_p99_ms": percentile(overheads, 99),
    }


def _logged(slug: str, since: float) -> dict[str, Any]:
    """What the gateway's call log says of a run's calls: how many it answered from memory,
    and how long their retrieval took."""
    from icrlhf.gateway.models import Call
    from icrlhf.integrations import journal

    journal.waited_for_all(journal.CALLS, timeout_s=60)  # the gateway logs after answering

    calls = Call.objects.filter(
        queue__slug=slug, created_at__gte=datetime.fromtimestamp(since, tz=UTC)
    )
    retrievals = [
        float(ms) for ms in calls.values_list("retrieval_ms", flat=True) if ms is not None
    ]
    return {
        "from_memory": calls.filter(source=Call.Source.MEMORY).count(),
        "retrieval_p50_ms": statistics.median(retrievals) if retrievals else float("nan"),
    }
