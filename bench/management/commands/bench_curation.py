"""Curation benchmark: the cost of retiring one example at 1k and at 10k stored examples.

Retiring is a row update, an audit event, and one payload update of one point in the store
(through the worker's task, run inline here): it should not grow with the store. Runs in a
throw-away world (SQLite file, Qdrant local folder). The stored vectors are random unit
vectors: embedding 10k texts would only slow the set-up, not change what is measured."""

import random
import statistics
import time
import uuid
from typing import Any

from django.core.management.base import CommandParser

from bench.world import WorldCommand, percentile, world

SIZES = (1_000, 10_000)
_BATCH = 500


class Command(WorldCommand):
    help = "Measure the cost of retiring one example at 1k and 10k stored examples."

    def add_options(self, parser: CommandParser) -> None:
        parser.add_argument("--retires", type=int, default=30, help="Retires timed per size.")

    def outside(self, options: dict[str, Any]) -> dict[str, Any]:
        with world("bench-curation") as here:
            return dict(here.inside("bench_curation", options))

    def measure(self, options: dict[str, Any]) -> dict[str, float]:
        return measure(options["retires"])

    def report(self, result: dict[str, Any], options: dict[str, Any]) -> None:
        for size in SIZES:
            median, p95 = (result[f"retire{kind}_ms_{size // 1000}k"] for kind in ("", "_p95"))
            self.stdout.write(
                f"Retire one example with {size:,} stored: median {median:.2f} ms, p95 {p95:.2f} ms"
            )
        ratio = result["retire_ms_10k"] / result["retire_ms_1k"]
        self.stdout.write(f"10k ÷ 1k: {ratio:.2f} (target: flat, about 1)")


def measure(retires: int) -> dict[str, float]:
    from django.contrib.auth.models import User

    from icrlhf.generation.models import Generation
    from icrlhf.integrations import embeddings, vectors
    from icrlhf.memory import curation, index
    from icrlhf.memory.models import Example
    from icrlhf.queues.models import Item, Queue
    from icrlhf.review.models import Decision
    from worker import app

    app.conf.task_always_eager = True  # the store is this process's: run the tasks inline
    rng = random.Random(7)
    curator = User.objects.create_user("bench-curator")
    queue = Queue.objects.create(slug="bench", name="Bench")
    item = Item.objects.create(queue=queue, input_text="bench", status=Item.Status.DECIDED)
    generation = Generation.objects.create(item=item, model="bench", n_candidates=1)
    decision = Decision.objects.create(
        item=item,
        generation=generation,
        reviewer=curator,
        verdict="none_acceptable",
        guideline_version=1,
    )
    collection = index.collection_of(queue.pk)
    model = embeddings.model_id()

    def add(count: int) -> None:
        for start in range(0, count, _BATCH):
            rows = [
                Example(
                    id=uuid.uuid4(),
                    queue=queue,
                    decision=decision,
                    input_text=f"q{start + n}",
                    output_text="a",
                    reward=1.0,
                    role="preferred",
                    index_state="indexed",
                    embedding_model=model,
                )
                for n in range(min(_BATCH, count - start))
            ]
            Example.objects.bulk_create(rows)
            points = []
            for row in rows:
                vector = [rng.gauss(0, 1) for _ in range(embeddings.DIMENSIONS)]
                norm = sum(v * v for v in vector) ** 0.5
                points.append(
                    vectors.Point(
                        id=row.id,
                        vector=[v / norm for v in vector],
                        payload={"role": "preferred", "status": "active", "weight": 1.0},
                    )
                )
            vectors.upsert(collection=collection, points=points)

    result: dict[str, float] = {}
    stored = 0
    for size in SIZES:
        add(size - stored)
        stored = size
        candidates = list(
            Example.objects.filter(queue=queue, status="active").values_list("pk", flat=True)[
                :retires
            ]
        )
        timings = []
        for example_id in candidates:
            started = time.perf_counter()
            curation.examples_status_set(
                ids=[example_id], status="retired", actor=curator, reason="bench"
            )
            timings.append((time.perf_counter() - started) * 1000)
        label = f"{size // 1000}k"
        result[f"retire_ms_{label}"] = statistics.median(timings)
        result[f"retire_p95_ms_{label}"] = percentile(timings, 95)
        assert vectors.count(collection=collection) == size
    return result
