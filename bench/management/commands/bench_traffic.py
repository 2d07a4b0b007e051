"""Production replay benchmark: a labelled stream (Banking77) sent through the gateway as an
application would, with capture, coverage routing and holdout on, and a simulated reviewer
deciding the captured calls as they arrive. It prints, per 100 calls, how often the served
answer named the right intent with memory and in the holdout, the share captured, and the
share answered from memory: the loop closed from production, measured on its own traffic.

Everything is real: the gateway process (uvicorn), the worker (which owns the embedded store
and generates the captured items' other candidates), retrieval with fastembed, the local LLM
(llama.cpp with LOCAL_LLM's model or --local-llm's, unless --llm-api-base names another)
and the review services. The
reviewer keeps the served answer when it names the gold intent, else picks a candidate that
does, else edits one to the gold intent. Production repeats itself: --repeat is the share of
calls that send a request seen before."""

import random
import time
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.management.base import CommandParser

from bench.world import WorldCommand, add_llm_options, llm_endpoint, world

WINDOW = 100


class Command(WorldCommand):
    help = "Replay a labelled stream through the gateway with capture and holdout on."

    def add_options(self, parser: CommandParser) -> None:
        parser.add_argument("--calls", type=int, default=300, help="Calls in the stream.")
        parser.add_argument("--repeat", type=float, default=0.3, help="Share of repeat calls.")
        parser.add_argument("--capture", type=int, default=20, help="Capture share, %%.")
        parser.add_argument(
            "--coverage", type=float, default=0.7, help="Capture calls below this similarity."
        )
        parser.add_argument("--holdout", type=int, default=10, help="Holdout share, %%.")
        parser.add_argument(
            "--answer-threshold", type=float, default=0.95, help="Answer from memory at."
        )
        parser.add_argument("--candidates", type=int, default=3, help="N per captured item.")
        parser.add_argument("--review-every", type=int, default=10, help="Calls between reviews.")
        parser.add_argument("--seed", type=int, default=7)
        add_llm_options(parser)

    def outside(self, options: dict[str, Any]) -> dict[str, Any]:
        started = time.monotonic()
        with llm_endpoint(options) as llm, world("bench-traffic", **llm) as here:
            here.worker(concurrency=4)
            _, gateway = here.gateway()
            result = dict(here.inside("bench_traffic", {**options, "gateway": gateway}))
        result["minutes"] = round((time.monotonic() - started) / 60, 1)
        return result

    def measure(self, options: dict[str, Any]) -> dict[str, Any]:
        return _replay(options)

    def report(self, result: dict[str, Any], options: dict[str, Any]) -> None:
        self.stdout.write(
            f"{'calls':>9} | {'accuracy, memory':>16} | {'accuracy, holdout':>17} | "
            f"{'captured':>8} | {'from memory':>11}"
        )
        for row in result["windows"]:
            self.stdout.write(
                f"{row['calls']:>9} | {_rate(row['accuracy_memory'], row['served_memory']):>16} | "
                f"{_rate(row['accuracy_holdout'], row['served_holdout']):>17} | "
                f"{row['captured_share']:>8.0%} | {row['from_memory_share']:>11.0%}"
            )
        self.stdout.write(
            f"{result['decisions']} captured calls decided; served accuracy with memory "
            f"{_rate(result['accuracy_memory_first'], None)} in the first {WINDOW} calls, "
            f"{_rate(result['accuracy_memory_last'], None)} in the last; "
            f"{result['minutes']} minutes."
        )


def _rate(value: float | None, count: int | None) -> str:
    shown = "–" if value is None else f"{value:.0%}"
    return shown if count is None else f"{shown} of {count}"


def _stream(options: dict[str, Any]) -> list[tuple[str, str]]:
    from bench.learning import labelled_split

    rng = random.Random(options["seed"])
    _, rows = labelled_split(
        settings.SHARED_DATA_DIR / "banking77" / "test.csv",
        seed=options["seed"],
        test=0,
        stream=options["calls"],
    )
    stream: list[tuple[str, str]] = []
    fresh = iter(rows)
    for _ in range(options["calls"]):
        if stream and rng.random() < options["repeat"]:
            stream.append(rng.choice(stream))
        else:
            row = next(fresh)
            stream.append((row.text, row.label))
    return stream


def _replay(options: dict[str, Any]) -> dict[str, Any]:
    import json

    import httpx
    from django.contrib.auth.models import User

    from bench.learning import label_of
    from icrlhf.gateway.models import Call
    from icrlhf.ingest.services import token_create
    from icrlhf.integrations import journal
    from icrlhf.queues.models import Queue

    labels: list[str] = json.loads(
        (settings.SHARED_DATA_DIR / "banking77" / "categories.json").read_text()
    )
    queue = Queue.objects.create(
        slug="traffic",
        name="Traffic",
        system_prompt=(
            "Classify the bank customer's message as exactly one of these intents: "
            + ", ".join(labels)
            + ". Answer with the intent label only."
        ),
        max_tokens=12,
        temperature=0.2,
        example_token_budget=4000,
        n_candidates=options["candidates"],
        k_examples=5,
        min_similarity=-1.0,
        memory_candidates=1,
        memory_min_similarity=0.8,
        capture_percent=options["capture"],
        capture_below_similarity=options["coverage"],
        holdout_percent=options["holdout"],
        memory_answer_threshold=options["answer_threshold"],
    )
    token = token_create(queue=queue, name="bench")[1]
    reviewer = User.objects.create_user("bench-reviewer")
    queue.members.add(reviewer)
    gold_of: dict[str, str] = {}
    served: list[dict[str, Any]] = []
    decisions = 0
    with httpx.Client(
        base_url=options["gateway"], headers={"Authorization": f"Bearer {token}"}, timeout=300
    ) as client:
        for number, (text, gold) in enumerate(_stream(options), start=1):
            gold_of[text] = gold
            response = client.post(
                "/chat/completions",
                json={"model": "traffic", "messages": [{"role": "user", "content": text}]},
            )
            response.raise_for_status()
            answer = response.json()["choices"][0]["message"]["content"]
            served.append(
                {
                    "call": response.headers["X-Icrlhf-Call"],
                    "right": label_of(answer, labels) == gold,
                    "memory_answer": response.headers["X-Icrlhf-Source"] == "memory",
                }
            )
            if number % options["review_every"] == 0:
                decisions += _review(queue, reviewer, gold_of, labels, label_of)
    decisions += _review(queue, reviewer, gold_of, labels, label_of)

    journal.waited_for_all(journal.CALLS, timeout_s=60)  # the gateway logs after answering
    rows = {
        str(pk): (holdout, capture)
        for pk, holdout, capture in Call.objects.filter(queue=queue).values_list(
            "pk", "holdout", "capture"
        )
    }
    for call in served:
        call["holdout"], capture = rows[call["call"]]
        call["captured"] = capture in (Call.Capture.SAMPLED, Call.Capture.UNCOVERED)
    windows = [
        _window(served[start : start + WINDOW], start) for start in range(0, len(served), WINDOW)
    ]
    return {
        "windows": windows,
        "decisions": decisions,
        "calls": len(served),
        "accuracy_memory_first": windows[0]["accuracy_memory"],
        "accuracy_memory_last": windows[-1]["accuracy_memory"],
        "accuracy_holdout_all": _window(served, 0)["accuracy_holdout"],
        "captured_share": _window(served, 0)["captured_share"],
        "from_memory_share": _window(served, 0)["from_memory_share"],
    }


def _window(calls: list[dict[str, Any]], start: int) -> dict[str, Any]:
    with_memory = [c for c in calls if not c["holdout"]]
    held_out = [c for c in calls if c["holdout"]]

    def accuracy(group: list[dict[str, Any]]) -> float | None:
        return sum(c["right"] for c in group) / len(group) if group else None

    return {
        "calls": f"{start + 1}–{start + len(calls)}",
        "served_memory": len(with_memory),
        "accuracy_memory": accuracy(with_memory),
        "served_holdout": len(held_out),
        "accuracy_holdout": accuracy(held_out),
        "captured_share": sum(c["captured"] for c in calls) / len(calls),
        "from_memory_share": sum(c["memory_answer"] for c in calls) / len(calls),
    }


def _review(
    queue: Any,
    reviewer: Any,
    gold_of: dict[str, str],
    labels: list[str],
    label_of: Callable[[str, list[str]], str],
) -> int:
    """Decide every captured item once its candidates are in, then wait until what it taught
    is indexed, so the next calls can use it."""
    from icrlhf.memory.models import Example
    from icrlhf.ops.stack import wait_until
    from icrlhf.queues.models import Item
    from icrlhf.review.decisions import decision_record

    waiting = Item.objects.filter(queue=queue, source=Item.Source.GATEWAY)
    wait_until(
        lambda: not waiting.filter(status=Item.Status.GENERATING).exists(),
        timeout_s=1800,
        what="the captured items' candidates",
    )
    decided = 0
    for item in waiting.filter(status=Item.Status.READY).order_by("pk"):
        gold = gold_of[item.input_text]
        candidates = list(item.generations.get().candidates.filter(status="done"))
        right = sorted(
            (c for c in candidates if label_of(c.text, labels) == gold), key=lambda c: not c.served
        )
        picked = right[0] if right else next(c for c in candidates if c.served)
        decision_record(
            item_id=item.pk,
            reviewer=reviewer,
            verdict="chosen" if right else "edited",
            candidate_id=picked.pk,
            final_text="" if right else gold,  # a right answer is taken as it is
        )
        decided += 1
    wait_until(
        lambda: not Example.objects.exclude(index_state=Example.IndexState.INDEXED).exists(),
        timeout_s=600,
        what="indexing",
    )
    return decided
