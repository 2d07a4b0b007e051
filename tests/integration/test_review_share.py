"""Review work never starves the calls the product serves (issue 46), through the real parts:
the gateway process and a Celery worker on Redis, both calling one model server over HTTP.

The server has a few parallel slots, as llama.cpp's has (--parallel): calls beyond them wait
in line. A flood of captured items used to send every generation to it at once, and an
application's call waited behind them past its timeout; review now takes at most its share of
the endpoint (REVIEW_GENERATION_MAX_CONCURRENT, 2), so the gateway's call finds a slot."""

import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from icrlhf.generation.models import Candidate, Generation
from icrlhf.generation.services import Served, item_create
from icrlhf.ingest.services import token_create
from icrlhf.queues.models import Item
from tests.factories import QueueFactory
from tests.support.fixed_latency_llm import FixedLatencyLLM
from tests.support.processes import GATEWAY_LLM_TIMEOUT_S, GatewayProcess
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

SLOTS = 3
# Past half the gateway's model timeout: a call that waits one turn in line times out.
HOLD_S = GATEWAY_LLM_TIMEOUT_S / 2
FLOOD_ITEMS = 10
CANDIDATES = 4  # the served answer and three generated, asked for in one request (`n`)


class SlottedLLM(FixedLatencyLLM):
    """Serves SLOTS calls at a time, each for HOLD_S; the others wait in line. Review's calls
    ask for several answers (`n`), the gateway's for one: that tells them apart."""

    def __init__(self) -> None:
        super().__init__(latency_s=0.0)
        self._slots = threading.Semaphore(SLOTS)
        self._counting = threading.Lock()
        self.review_at_once = self.most_review_at_once = self.review_calls = 0

    def respond(self, request: dict[str, Any]) -> tuple[int, bytes]:
        review = (request.get("n") or 1) > 1
        if review:
            with self._counting:
                self.review_calls += 1
                self.review_at_once += 1
                self.most_review_at_once = max(self.most_review_at_once, self.review_at_once)
        try:
            with self._slots:
                time.sleep(HOLD_S)
                return super().respond(request)
        finally:
            if review:
                with self._counting:
                    self.review_at_once -= 1


@pytest.fixture
def slotted_llm() -> Iterator[SlottedLLM]:
    llm = SlottedLLM().start()
    yield llm
    llm.stop()


def test_a_flood_of_captures_never_makes_a_gateway_call_time_out(
    gateway_process: GatewayProcess, slotted_llm: SlottedLLM
) -> None:
    queue = QueueFactory(api_base=slotted_llm.api_base, n_candidates=CANDIDATES)
    token = token_create(queue=queue, name="app")[1]
    flood = [
        item_create(
            queue=queue,
            input_text=f"Captured call {n}: where is my card?",
            created_by=None,
            source=Item.Source.GATEWAY,
            served=Served(text="It ships tomorrow.", model="served-model"),
        )
        for n in range(FLOOD_ITEMS)
    ]
    prepared = Generation.objects.filter(item__in=flood, prepared_at__isnull=False)
    wait_for(
        lambda: prepared.count() == FLOOD_ITEMS and slotted_llm.review_calls >= 2,
        timeout_s=60,
        what="the flood to reach the model",
    )

    # The application's call, while the flood is pending.
    answered = httpx.post(
        f"{gateway_process.base_url}/chat/completions",
        json={"model": queue.slug, "messages": [{"role": "user", "content": "Is my card late?"}]},
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    )
    assert answered.status_code == 200, answered.text
    assert "Is my card late?" in answered.json()["choices"][0]["message"]["content"]
    assert Item.objects.filter(pk__in=[i.pk for i in flood]).exclude(status="ready").exists()

    # Review never held more than its share of the endpoint, and the flood still completes.
    wait_for(
        lambda: (
            Item.objects.filter(pk__in=[i.pk for i in flood], status="ready").count() == FLOOD_ITEMS
        ),
        timeout_s=120,
        what="the flood's candidates",
    )
    assert slotted_llm.most_review_at_once <= 2
    done = Candidate.objects.filter(generation__item__in=flood, status=Candidate.Status.DONE)
    assert done.count() == FLOOD_ITEMS * CANDIDATES
    assert not Candidate.objects.filter(generation__item__in=flood, attempts__gt=1).exists()
