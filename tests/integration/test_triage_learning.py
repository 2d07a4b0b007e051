"""Triage learns, through the real worker: confirmed triages of tickets about one intent are
retrieved for the next ticket about it, and its prompt carries their confirmed categories."""

import json
from typing import Any

import pytest

from icrlhf.generation.prompts import examples_sent
from icrlhf.memory.models import Example
from icrlhf.queues.models import Item
from icrlhf.review.decisions import decision_record
from icrlhf.triage.services import ticket_create
from tests.factories import QueueFactory, UserFactory
from tests.support.processes import WorkerProcess
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

CATEGORIES = ["card_arrival", "exchange_rate", "pin_blocked", "lost_or_stolen_card"]
CARD_TICKETS = [
    ("Card not here", "I ordered my card two weeks ago and it still has not arrived."),
    ("Where is my card", "My new card hasn't been delivered yet, what is going on?"),
    ("Card delivery", "How long does it take for the card to arrive? Still waiting."),
]
OTHER_TICKET = ("PIN locked", "I typed my PIN wrong three times and now it is blocked.")


def ready(item: Item) -> Item:
    wait_for(lambda: Item.objects.get(pk=item.pk).status == Item.Status.READY, what="triage")
    return Item.objects.get(pk=item.pk)


def confirm(item: Item, reviewer: Any, category: str) -> None:
    candidate = item.generations.get().candidates.first()
    assert candidate is not None
    decision_record(
        item_id=item.pk,
        reviewer=reviewer,
        verdict="chosen",
        candidate_id=candidate.pk,
        corrections={"category": category, "priority": "high", "reply": "We are on it."},
    )


def test_confirmed_triages_teach_the_next_ticket(worker_process: WorkerProcess) -> None:
    reviewer = UserFactory()
    queue = QueueFactory(
        kind="triage", categories=CATEGORIES, n_candidates=2, k_examples=3, members=[reviewer]
    )
    for subject, body in [*CARD_TICKETS, OTHER_TICKET]:
        item, _ = ticket_create(queue=queue, subject=subject, body=body, source="api")
        category = "pin_blocked" if subject == OTHER_TICKET[0] else "card_arrival"
        confirm(ready(item), reviewer, category)
        assert Item.objects.get(pk=item.pk).category == category
    wait_for(lambda: not Example.objects.exclude(index_state="indexed").exists(), what="indexing")

    new, _ = ticket_create(
        queue=queue,
        subject="No card yet",
        body="My card still hasn't arrived, can you check?",
        source="api",
    )
    generation = ready(new).generations.get()
    retrieved = list(generation.retrievals.select_related("example__decision__item"))
    assert len(retrieved) == 3
    assert {r.example.decision.item.subject for r in retrieved} == {s for s, _ in CARD_TICKETS}
    shown = [json.loads(e.output_text) for e in examples_sent(generation.messages)]
    assert [turn["category"] for turn in shown] == ["card_arrival"] * 3
    system = generation.messages[0]["content"]
    assert "Choose exactly one category from this list: card_arrival, exchange_rate" in system
    assert generation.messages[-1]["content"].startswith("No card yet\n\n")
