"""Export benchmark: time and memory of exporting 100k decisions (generated fixtures).

In a throw-away SQLite world: one process generates the fixtures, a fresh one exports them
(canonical JSONL, to a file) and reports its time and how far its peak resident memory rose
above where it started."""

import time
from pathlib import Path
from typing import Any

from django.core.management.base import CommandParser

from bench.world import WorldCommand, world

_BATCH = 5_000


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


class Command(WorldCommand):
    help = "Measure exporting 100k decisions: seconds and peak memory growth."

    def add_options(self, parser: CommandParser) -> None:
        parser.add_argument("--decisions", type=int, default=100_000)
        parser.add_argument("--format", default="canonical")
        parser.add_argument("--seed", action="store_true", help="(internal)")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["seed"]:
            seed(options["decisions"])
            return
        super().handle(*args, **options)

    def outside(self, options: dict[str, Any]) -> dict[str, Any]:
        with world("bench-export") as here:
            started = time.monotonic()
            here.manage("bench_export", "--seed", "--decisions", str(options["decisions"]))
            seeding_s = time.monotonic() - started
            # A fresh process exports, so its memory growth is the export's alone.
            result = dict(here.inside("bench_export", options))
        result["seeding_s"] = round(seeding_s, 1)
        return result

    def measure(self, options: dict[str, Any]) -> dict[str, Any]:
        return measure(options["format"])

    def report(self, result: dict[str, Any], options: dict[str, Any]) -> None:
        self.stdout.write(
            f"Exported {result['decisions']:,} decisions ({result['lines']:,} {options['format']} "
            f"lines, {result['megabytes']:.0f} MB) in {result['export_100k_s']:.1f} s; peak "
            f"memory grew {result['export_memory_growth_mb']:.1f} MB (targets ≤ 30 s, ≤ 100 MB)"
        )


def seed(count: int) -> None:
    from django.contrib.auth.models import User

    from icrlhf.generation.models import Candidate, Generation
    from icrlhf.queues.models import Item, Queue
    from icrlhf.review.models import Decision

    reviewer = User.objects.create_user("bench-reviewer")
    queue = Queue.objects.create(slug="bench", name="Bench", n_candidates=4)
    messages = [
        {"role": "system", "content": "You are a helpful bank agent."},
        {"role": "user", "content": "placeholder"},
    ]
    answer = "Thank you for your message. Your card was posted and arrives in 3 working days. "
    for start in range(0, count, _BATCH):
        size = min(_BATCH, count - start)
        items = Item.objects.bulk_create(
            Item(
                queue=queue,
                input_text=f"Request {start + n}: where is my card?",
                status=Item.Status.DECIDED,
            )
            for n in range(size)
        )
        generations = Generation.objects.bulk_create(
            Generation(
                item=item,
                model="bench-model",
                n_candidates=4,
                messages=messages,
                params={"temperature": 0.7, "max_tokens": 256},
                status=Generation.Status.DONE,
            )
            for item in items
        )
        candidates = Candidate.objects.bulk_create(
            Candidate(generation=generation, position=p, status="done", text=f"{p}. {answer}")
            for generation in generations
            for p in range(4)
        )
        Decision.objects.bulk_create(
            Decision(
                item=item,
                generation=generation,
                reviewer=reviewer,
                verdict="chosen",
                chosen_candidate=candidates[4 * n],
                final_text=candidates[4 * n].text,
                guideline_version=1,
            )
            for n, (item, generation) in enumerate(zip(items, generations, strict=True))
        )


def measure(fmt: str) -> dict[str, Any]:
    import tempfile as temp

    from icrlhf.export.selectors import ExportFilters
    from icrlhf.export.services import export_lines
    from icrlhf.review.models import Decision

    decisions = Decision.objects.count()
    rss_before_kb = _status_kb("VmRSS")
    started = time.monotonic()
    lines = size = 0
    with temp.NamedTemporaryFile("w", encoding="utf-8", suffix=".jsonl") as out:
        for line in export_lines(fmt=fmt, filters=ExportFilters(), consumer="bench"):
            out.write(line)
            lines += 1
            size += len(line)
    elapsed = time.monotonic() - started
    growth_mb = (_status_kb("VmHWM") - rss_before_kb) / 1024
    return {
        "decisions": decisions,
        "lines": lines,
        "megabytes": size / 1e6,
        "export_100k_s": elapsed * 100_000 / max(decisions, 1),
        "export_s": elapsed,
        "export_memory_growth_mb": growth_mb,
    }
