"""Gateway benchmark: what the OpenAI-compatible endpoint adds to an upstream call, how fast it
answers from memory, and how many calls a second it carries.

A throw-away world (SQLite file, or a scratch PostgreSQL database; Qdrant local folder; its
own broker queue) holds two queues with 1k and 10k preferred examples, embedded by the real
model from Banking77's requests. The real worker (which owns the embedded store and answers
the gateway's retrievals) and the real gateway process (uvicorn) run against an
OpenAI-compatible endpoint with a fixed latency. Clients call the gateway over HTTP, 1 and 32
at a time, with paraphrased requests (the upstream answers) and with stored requests on a
queue that answers from memory.

Overhead = the time the client waited minus the upstream call's time, as the gateway measured
it around the call (`Server-Timing: upstream`): retrieval, the prompt, the database and the
HTTP layers."""

import asyncio
import csv
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.management.base import CommandParser

from bench.world import WorldCommand, percentile, world
from tests.support.fixed_latency_llm import FixedLatencyLLM

SIZES = (1_000, 10_000)
CLIENTS = (1, 32)
_BATCH = 500
# A stored request's own text scores ~1.0: well above this, so every such call is answered
# from memory; paraphrases (the other calls) stay below it and go to the model.
_MEMORY_THRESHOLD = 0.97


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
            "--recall-timeout",
            type=float,
            default=settings.GATEWAY_RECALL_TIMEOUT_S,
            help="GATEWAY_RECALL_TIMEOUT_S for the gateway under test, s.",
        )

    def outside(self, options: dict[str, Any]) -> dict[str, Any]:
        llm = FixedLatencyLLM(latency_s=options["latency"]).start()
        try:
            with world(
                "bench-gateway",
                database_url=options["database_url"],
                LLM_API_BASE=llm.api_base,
                LLM_MODEL="openai/fixed-latency",
                GATEWAY_RECALL_TIMEOUT_S=str(options["recall_timeout"]),
            ) as here:
                seeded = here.inside("bench_gateway", {**options, "phase": "seed"})
                here.worker(concurrency=8)
                _, api_base = here.gateway()

                def threshold_set(slug: str, threshold: float | None) -> None:
                    phase = {"phase": "threshold", "slug": slug, "threshold": threshold}
                    here.inside("bench_gateway", {**options, **phase})

                return asyncio.run(_load(api_base, seeded, options, threshold_set))
        finally:
            llm.stop()

    def measure(self, options: dict[str, Any]) -> dict[str, Any]:
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
        self.stdout.write(
            f"Targets: overhead p95 at 10k, 32 clients {result['overhead_p95_ms_10k_32']:.1f} ms "
            f"(≤ 25); memory answers p95 {result['memory_answer_p95_ms']:.1f} ms (≤ 25); "
            f"throughput at 32 clients {result['throughput_rps_32']:.1f} calls/s (≥ 28)"
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
        stored = Example.objects.filter(queue=queue).order_by("?")
        seeded["queues"][slug] = {
            "size": size,
            "token": token_create(queue=queue, name="bench")[1],
            "stored": list(stored.values_list("input_text", flat=True)[:200]),
        }
    return seeded


async def _load(
    api_base: str,
    seeded: dict[str, Any],
    options: dict[str, Any],
    threshold_set: Callable[[str, float | None], None],
) -> dict[str, Any]:
    import httpx

    paraphrases = [text for text, _ in _texts()]
    runs: dict[str, Any] = {}
    memory: dict[str, Any] = {}
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with httpx.AsyncClient(base_url=api_base, timeout=60, limits=limits) as http:
        for slug, queue in seeded["queues"].items():
            size = queue["size"]
            for clients in CLIENTS:
                calls = clients * options["calls_per_client"]
                await _run(http, queue["token"], slug, paraphrases[:clients], clients)  # warm
                runs[f"{_label(size)}_{clients}"] = await _run(
                    http, queue["token"], slug, paraphrases, calls, clients=clients
                )
            threshold_set(slug, _MEMORY_THRESHOLD)
            for clients in CLIENTS:
                calls = clients * options["calls_per_client"]
                memory[f"{_label(size)}_{clients}"] = await _run(
                    http, queue["token"], slug, queue["stored"], calls, clients=clients
                )
            threshold_set(slug, None)
    biggest = _label(max(q["size"] for q in seeded["queues"].values()))
    return {
        "runs": runs,
        "memory": memory,
        "overhead_p95_ms_10k_32": runs[f"{biggest}_32"]["overhead_p95_ms"],
        "memory_answer_p95_ms": memory[f"{biggest}_1"]["latency_p95_ms"],
        "memory_answer_p95_ms_32": memory[f"{biggest}_32"]["latency_p95_ms"],
        "throughput_rps_32": runs[f"{biggest}_32"]["throughput_rps"],
    }


def _upstream_ms(timing: str) -> float:
    parts = dict(
        (entry.split(";dur=")[0].strip(), float(entry.split(";dur=")[1]))
        for entry in timing.split(",")
        if ";dur=" in entry
    )
    return parts.get("upstream", 0.0)


async def _run(
    http: Any, token: str, slug: str, texts: list[str], calls: int, *, clients: int = 0
) -> dict[str, Any]:
    clients = clients or calls
    walls: list[float] = []
    overheads: list[float] = []
    retrievals: list[float] = []
    errors = from_memory = 0
    next_call = iter(range(calls))

    async def client() -> None:
        nonlocal errors, from_memory
        for n in next_call:
            body = {"model": slug, "messages": [{"role": "user", "content": texts[n % len(texts)]}]}
            started = time.perf_counter()
            response = await http.post(
                "/chat/completions", json=body, headers={"Authorization": f"Bearer {token}"}
            )
            wall = (time.perf_counter() - started) * 1000
            if response.status_code != 200:
                errors += 1
                continue
            from_memory += response.headers.get("x-icrlhf-source") == "memory"
            timing = response.headers.get("server-timing", "")
            walls.append(wall)
            overheads.append(wall - _upstream_ms(timing))
            retrievals.append(
                float(timing.split("retrieval;dur=")[1].split(",")[0])
                if "retrieval" in timing
                else 0.0
            )

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    elapsed = time.perf_counter() - started
    return {
        "calls": calls,
        "errors": errors,
        "from_memory": from_memory,
        "throughput_rps": len(walls) / elapsed,
        "latency_p50_ms": statistics.median(walls) if walls else float("nan"),
        "latency_p95_ms": percentile(walls, 95),
        "overhead_p50_ms": statistics.median(overheads) if overheads else float("nan"),
        "overhead_p95_ms": percentile(overheads, 95),
        "retrieval_p50_ms": statistics.median(retrievals) if retrievals else float("nan"),
    }
