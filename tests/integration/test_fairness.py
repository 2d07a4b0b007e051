"""Fairness across queues through the real parts: a Celery worker on Redis, litellm over HTTP.
One queue flooded with items must not make another queue's item wait behind all of them."""

from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest

from icrlhf.generation.models import Candidate, Generation
from icrlhf.generation.services import item_create
from icrlhf.generation.tasks import broker_backlog
from icrlhf.queues.models import Item
from tests.factories import QueueFactory, UserFactory
from tests.support.fixed_latency_llm import FixedLatencyLLM
from tests.support.processes import WorkerProcess
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

LATENCY_S = 0.5
FLOOD_ITEMS = 30  # x 8 candidates: 12 s of work for the 10 worker threads


@pytest.fixture
def slow_llm() -> Iterator[FixedLatencyLLM]:
    llm = FixedLatencyLLM(latency_s=LATENCY_S).start()
    yield llm
    llm.stop()


def _finished_at(item: Item) -> datetime:
    wait_for(
        lambda: Item.objects.get(pk=item.pk).status == Item.Status.READY,
        timeout_s=120,
        what=f"item {item.pk}",
    )
    generation = Generation.objects.get(item=item)
    assert generation.finished_at is not None
    return generation.finished_at


def test_an_item_in_another_queue_is_not_starved_by_a_flooded_queue(
    worker_process: WorkerProcess, slow_llm: FixedLatencyLLM
) -> None:
    person: Any = UserFactory()
    flooded = QueueFactory(n_candidates=8, api_base=slow_llm.api_base)
    other = QueueFactory(n_candidates=4, api_base=slow_llm.api_base)
    _finished_at(item_create(queue=other, input_text="Warm-up", created_by=person))

    flood = [
        item_create(queue=flooded, input_text=f"Flood {n}", created_by=person)
        for n in range(FLOOD_ITEMS)
    ]
    wait_for(
        lambda: (
            Candidate.objects.filter(
                generation__item__in=flood, status=Candidate.Status.RUNNING
            ).count()
            >= 5
        ),
        what="the worker to be busy with the flood",
    )
    finished_at = _finished_at(
        item_create(queue=other, input_text="My card is late", created_by=person)
    )

    # By the order of events, not the clock: starved, it would finish behind the flood, which
    # was all sent before it; served fairly, it waits only for a worker thread to come free
    # (its 4 candidates and its preparation each queue for one), and most of the flood is
    # still unfinished when it is done.
    flood_done_before = Generation.objects.filter(
        item__in=flood, finished_at__lte=finished_at
    ).count()
    assert flood_done_before < FLOOD_ITEMS // 2, f"{flood_done_before} flood items went first"

    # Call the flood off so the next tests find an idle worker and an empty broker.
    Candidate.objects.filter(generation__item__in=flood, status=Candidate.Status.PENDING).update(
        status=Candidate.Status.FAILED
    )
    Generation.objects.filter(item__in=flood).exclude(
        status__in=[Generation.Status.DONE, Generation.Status.FAILED]
    ).update(status=Generation.Status.FAILED)
    wait_for(lambda: broker_backlog() == 0, what="the flood to drain")
    wait_for(
        lambda: not Candidate.objects.filter(status=Candidate.Status.RUNNING).exists(),
        what="the running calls to end",
    )
