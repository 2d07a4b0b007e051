"""bench_triage's measurement, inside its world (see the command's docstring)."""

import itertools
import json
import random
import time
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction

from bench.learning import Labelled, labelled_split
from bench.playbook_arms import playbook_arms
from bench.reviewed import answer_chosen, examples_indexed
from icrlhf.generation.models import Candidate
from icrlhf.insights.stats import wilson
from icrlhf.kinds.triage.fields import fields_text
from icrlhf.ops.demo import demo_login_ensure, demo_triage_queue_ensure
from icrlhf.queues.models import Item, Queue
from icrlhf.review.decisions import decision_record
from icrlhf.triage.services import ticket_create, ticket_input_text

TIMEOUT_S = 3600
# Each ticket's external id (bench-N), unique across every queue of the run.
_TICKET_NUMBERS = itertools.count(100_000)
# The demo's triage queue, as `make run` seeds it (Banking77's 77 intents as categories).
QUEUE_SETTINGS = {
    "kind": Queue.Kind.TRIAGE,
    "system_prompt": "You triage the support tickets of an online bank.",
    "max_tokens": 120,
    "temperature": 0.8,
    "memory_candidates": 0,  # the model's own proposals are what is measured
    "blind_percent": 0,  # the ranking's order is what is measured, never shuffled
}


def _ticket(queue: Queue, row: Labelled, number: int) -> Item:
    item, _created = ticket_create(
        queue=queue,
        subject=_subject(row.text),
        body=row.text,
        source="import",
        external_id=f"bench-{number}",
    )
    return item


def _subject(text: str) -> str:
    words = text.split()
    return " ".join(words[:5]) + ("…" if len(words) > 5 else "")


def _settled(items: list[Item]) -> list[Item]:
    """The items once every one of them is ready or failed (the worker generates them)."""
    ids = [item.pk for item in items]
    deadline = time.monotonic() + TIMEOUT_S
    waiting = Item.objects.filter(pk__in=ids).exclude(
        status__in=[Item.Status.READY, Item.Status.FAILED]
    )
    while waiting.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{waiting.count()} tickets still generating")
        time.sleep(1)
    return list(Item.objects.filter(pk__in=ids).order_by("pk"))


def _proposals(items: list[Item]) -> list[Candidate]:
    return list(
        Candidate.objects.filter(generation__item__in=items, source="llm").order_by(
            "generation__item", "position"
        )
    )


def _valid(items: list[Item]) -> dict[str, Any]:
    """Valid among the proposals the model made; calls that failed (a timeout on a busy
    machine) are counted apart: they say nothing of what the model writes."""
    candidates = _proposals(items)
    answered = [c for c in candidates if c.status == Candidate.Status.DONE]
    valid = sum(bool(c.fields) for c in answered)
    return {
        "tickets": len(items),
        "proposals": len(answered),
        "failed_calls": len(candidates) - len(answered),
        "valid": valid,
        "valid_share": valid / len(answered) if answered else 0.0,
        "invalid_examples": [f"{c.parse_error} {c.text[:300]!r}" for c in answered if not c.fields][
            :5
        ],
    }


@transaction.atomic
def _remember(queue: Queue, row: Labelled, reviewer: Any) -> None:
    """A ticket triaged right by a reviewer: its confirmed triage becomes an example."""
    item = Item.objects.create(
        queue=queue,
        input_text=ticket_input_text(subject=_subject(row.text), body=row.text),
        subject=_subject(row.text),
        body=row.text,
        source=Item.Source.IMPORT,
        status=Item.Status.READY,
    )
    gold = {"category": row.label, "priority": "normal", "reply": "Thanks, we are on it."}
    answer_chosen(item, model="gold", reviewer=reviewer, text=fields_text(gold), fields=gold)


def _accuracy(queue: Queue, rows: list[Labelled]) -> dict[str, Any]:
    """The held-out tickets triaged through `queue`: how often its first proposal names the
    true category."""
    items = _settled([_ticket(queue, row, next(_TICKET_NUMBERS)) for row in rows])
    first = {
        c.generation.item_id: c
        for c in reversed(
            Candidate.objects.filter(generation__item__in=items)
            .select_related("generation")
            .order_by("generation__item", "position")
        )
    }
    right = sum(
        bool(first.get(item.pk) and (first[item.pk].fields or {}).get("category") == row.label)
        for item, row in zip(items, rows, strict=True)
    )
    low, high = wilson(right, len(items))
    return {
        "tickets": len(items),
        "right": right,
        "accuracy": right / len(items),
        "accuracy_ci95": [low, high],
        "valid_share": _valid(items)["valid_share"],
    }


def _reviewed(queue: Queue, rows: list[Labelled], reviewer: Any) -> dict[str, int]:
    """Tickets the model triages, decided as a reviewer would: its first proposal taken when
    its category is right, else corrected to the right one (an edit: a decision the first
    candidate lost, what reflection reads)."""
    items = _settled([_ticket(queue, row, next(_TICKET_NUMBERS)) for row in rows])
    counts = {"tickets": len(items), "first_right": 0, "corrected": 0}
    for item, row in zip(items, rows, strict=True):
        first = (
            Candidate.objects.filter(generation__item=item, status=Candidate.Status.DONE)
            .order_by("position")
            .first()
        )
        if first is None or not first.fields:
            continue  # nothing valid to correct
        right = first.fields.get("category") == row.label
        decision_record(
            item_id=item.pk,
            reviewer=reviewer,
            verdict="chosen",
            candidate_id=first.pk,
            corrections={} if right else {"category": row.label},
        )
        counts["first_right" if right else "corrected"] += 1
    return counts


def _playbook(
    queue: Queue,
    reviewer: Any,
    reviewed_rows: list[Labelled],
    held_out: list[Labelled],
    options: dict[str, Any],
) -> dict[str, Any]:
    """The playbook's arms: tickets reviewed as above (memory grows by them too, so the
    held-out tickets are measured again with that memory and no playbook), then the rounds
    of reflection and the arms, the model alone through a queue with no memory."""
    reviewed = _reviewed(queue, reviewed_rows, reviewer)
    examples_indexed([queue], timeout_s=TIMEOUT_S)
    examples_only = _accuracy(queue, held_out)
    plain = Queue.objects.create(
        slug="bench-triage-plain",
        name="Bench triage, no memory",
        categories=queue.categories,
        n_candidates=1,
        k_examples=0,
        **QUEUE_SETTINGS,
    )
    return {
        "reviewed": reviewed,
        "examples_only": examples_only,
        **playbook_arms(
            queue=queue,
            plain=plain,
            reviewer=reviewer,
            rounds=options["playbook_rounds"],
            rng=random.Random(options["seed"]),
            evaluate=lambda: _accuracy(queue, held_out),
            alone=lambda: _accuracy(plain, held_out),
        ),
    }


def measure(options: dict[str, Any], *, sizes: list[int]) -> dict[str, Any]:
    data = settings.SHARED_DATA_DIR / "banking77"
    labels: list[str] = json.loads((data / "categories.json").read_text())
    held_out, stream = labelled_split(
        data / "test.csv",
        seed=options["seed"],
        test=options["held_out"],
        stream=options["tickets"] + max(sizes) + options["playbook_tickets"],
    )
    validity_rows, memory_rows = stream[: options["tickets"]], stream[options["tickets"] :]

    demo_login_ensure()
    demo, _count = demo_triage_queue_ensure(data_dir=settings.SHARED_DATA_DIR)
    assert demo is not None, "bench_triage needs the Banking77 dataset"
    demo_items = _settled(list(Item.objects.filter(queue=demo)))

    bulk = Queue.objects.create(
        slug="bench-triage",
        name="Bench triage",
        categories=labels,
        n_candidates=options["candidates"],
        **QUEUE_SETTINGS,
    )
    bulk_items = _settled([_ticket(bulk, row, n) for n, row in enumerate(validity_rows)])

    reviewer = get_user_model().objects.create_user("bench-reviewer")
    learning = Queue.objects.create(
        slug="bench-triage-learning",
        name="Bench triage learning",
        categories=labels,
        n_candidates=1,
        **QUEUE_SETTINGS,
    )
    learning.members.add(reviewer)
    accuracy: dict[str, dict[str, Any]] = {}
    stored = 0
    for size in sizes:
        for row in memory_rows[stored:size]:
            _remember(learning, row, reviewer)
        stored = size
        examples_indexed([learning], timeout_s=TIMEOUT_S)
        accuracy[str(size)] = _accuracy(learning, held_out)
    playbook = {}
    if options["playbook_rounds"]:
        reviewed_rows = memory_rows[max(sizes) :]
        playbook = _playbook(learning, reviewer, reviewed_rows, held_out, options)
    return {
        "valid": {"demo": _valid(demo_items), "banking77": _valid(bulk_items)},
        "accuracy": accuracy,
        "playbook": playbook,
        "triage_valid_share": _valid([*demo_items, *bulk_items])["valid_share"],
        "model": settings.LLM_MODEL,
        "structured_output": True,
        "stored_decisions_recorded_from_gold_labels": True,
        "seed": options["seed"],
    }
