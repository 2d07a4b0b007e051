"""A deadline that fits the model (issue 60): the gateway reads the model's pace from its
latest calls in the log, refuses at once a call it could not answer in time (503 with
Retry-After, the upstream never asked), and lets the upstream wait what is left of the
call's deadline rather than LLM_TIMEOUT_S. The upstream is a real local endpoint
(FixedLatencyLLM) reached through litellm's real code path."""

import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from icrlhf.gateway import pace
from icrlhf.gateway.models import Call
from icrlhf.ingest.services import token_create
from icrlhf.queues.models import Queue
from tests.factories import QueueFactory
from tests.support.fixed_latency_llm import FixedLatencyLLM

pytestmark = [
    pytest.mark.django_db(transaction=True),  # the gateway's threads have their own connections
    pytest.mark.urls("icrlhf.gateway.urls"),
    pytest.mark.usefixtures("eager_tasks", "vector_store", "gateway_threads"),
]

URL = "/v1/chat/completions"
MODEL = "openai/fixed"


@pytest.fixture
def upstream() -> Iterator[FixedLatencyLLM]:
    server = FixedLatencyLLM(latency_s=0).start()
    yield server
    server.stop()


@pytest.fixture
def queue(upstream: FixedLatencyLLM) -> Queue:
    return QueueFactory(slug="helpdesk", api_base=upstream.api_base, model=MODEL)


@pytest.fixture
def client(queue: Queue) -> Client:
    token = token_create(queue=queue, name="app")[1]
    return Client(headers={"Authorization": f"Bearer {token}"})


def ask(client: Client, **body: Any) -> Any:
    payload = {"model": "helpdesk", "messages": [{"role": "user", "content": "Hi"}], **body}
    return client.post(URL, json.dumps(payload), content_type="application/json")


def calls_logged(queue: Queue, *, waited_ms: int, count: int = 5, **fields: Any) -> None:
    """Answered calls of the model, as the log keeps them: each waited `waited_ms` for a
    slot, read 500 prompt tokens in 5 s and wrote 50 in 5 s."""
    for _ in range(count):
        Call.objects.create(
            queue=queue,
            source=Call.Source.MODEL,
            memory=Call.Memory.EMPTY,
            **{
                "model": MODEL,
                "upstream_ms": waited_ms + 10_000,
                "model_prompt_ms": 5_000,
                "model_generation_ms": 5_000,
                "prompt_tokens": 500,
                "completion_tokens": 50,
                **fields,
            },
        )


def test_a_call_the_busy_model_could_not_answer_in_time_is_refused_at_once(
    queue: Queue, client: Client, upstream: FixedLatencyLLM, settings: Any
) -> None:
    settings.GATEWAY_CALL_DEADLINE_S = 120
    calls_logged(queue, waited_ms=150_000)  # the model's calls now wait 150 s for a slot
    for stream in (False, True):
        response = ask(client, stream=stream)
        assert response.status_code == 503
        error = response.json()["error"]
        assert error["type"] == "upstream_error"
        assert "too busy to answer in time" in error["message"]
        # About when it would be answered: 150 s of waiting and more, against 120 s.
        assert 30 <= int(response["Retry-After"]) <= 600
    assert upstream.calls == 0  # never sent
    refused = Call.objects.filter(status_code=503)
    assert refused.count() == 2 and "GATEWAY_CALL_DEADLINE_S" in refused.first().error


def test_a_call_the_model_can_answer_in_time_goes_ahead(
    queue: Queue, client: Client, upstream: FixedLatencyLLM, settings: Any
) -> None:
    settings.GATEWAY_CALL_DEADLINE_S = 120
    calls_logged(queue, waited_ms=30_000)
    assert ask(client).status_code == 200
    assert upstream.calls == 1


def test_only_recent_answered_calls_of_the_model_tell_its_pace(
    queue: Queue, client: Client, upstream: FixedLatencyLLM, settings: Any
) -> None:
    """Calls older than the window, failed or refused calls, and another model's calls say
    nothing of the model's pace now: without evidence, the call goes ahead."""
    settings.GATEWAY_CALL_DEADLINE_S = 120
    slow = 500_000
    long_ago = timezone.now() - timedelta(seconds=pace.PACE_WINDOW_S + 5)
    calls_logged(queue, waited_ms=slow, created_at=long_ago)
    calls_logged(queue, waited_ms=slow, status_code=504)
    calls_logged(queue, waited_ms=slow, model="openai/another")
    calls_logged(queue, waited_ms=slow, model_prompt_ms=None, model_generation_ms=None)
    assert pace.model_pace(MODEL) is None
    pace._read.clear()
    assert ask(client).status_code == 200


def test_the_pace_is_the_median_wait_and_the_tokens_speed(queue: Queue) -> None:
    calls_logged(queue, waited_ms=2_000, count=3)
    calls_logged(queue, waited_ms=90_000, count=2, completion_tokens=150)
    read = pace.model_pace(MODEL)
    assert read is not None and read.calls == 5
    assert read.waited_s == 2.0  # the median: two slow calls do not make the model slow
    assert read.prompt_s_per_token == pytest.approx(25 / 2500)
    assert read.answer_s_per_token == pytest.approx(25 / 450)
    assert read.answer_tokens == 50
    # A prompt of 1,000 tokens, an answer as long as the recent ones or as long as allowed.
    assert read.expected_s(prompt_tokens=1000, max_tokens=0) == pytest.approx(
        2 + 10 + 50 * 25 / 450
    )
    assert read.expected_s(prompt_tokens=1000, max_tokens=10) == pytest.approx(
        2 + 10 + 10 * 25 / 450
    )


def test_a_process_reads_the_pace_at_most_once_a_second(
    queue: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = 1000.0
    monkeypatch.setattr(pace, "clock", lambda: now)
    assert pace.model_pace(MODEL) is None
    calls_logged(queue, waited_ms=1_000)
    assert pace.model_pace(MODEL) is None  # read within the second: as it was
    now += 1.5
    assert pace.model_pace(MODEL) is not None


def test_the_upstream_waits_until_the_calls_deadline_not_llm_timeout(
    client: Client, upstream: FixedLatencyLLM, settings: Any
) -> None:
    """A call waiting on a busy server longer than LLM_TIMEOUT_S was lost before its
    deadline: it is answered while the deadline holds."""
    assert ask(client).status_code == 200  # the embedding model loaded: the time is upstream's
    settings.LLM_TIMEOUT_S = 0.5
    settings.GATEWAY_CALL_DEADLINE_S = 10
    upstream.latency_s = 1.5
    assert ask(client).status_code == 200
