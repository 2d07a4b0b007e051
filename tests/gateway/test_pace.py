"""A deadline that fits the model (issue 60): the gateway reads the model's pace from its
latest calls in the log, refuses at once a call it could not answer in time (503 with
Retry-After, the upstream never asked), and lets the upstream wait what is left of the
call's deadline rather than LLM_TIMEOUT_S. The upstream is a real local endpoint
(FixedLatencyLLM) reached through litellm's real code path."""

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
from tests.support.gateway_app import ask, helpdesk_queue_fixture, upstream_fixture  # noqa: F401

pytestmark = [
    pytest.mark.django_db(transaction=True),  # the gateway's threads have their own connections
    pytest.mark.urls("icrlhf.gateway.urls"),
    pytest.mark.usefixtures("eager_tasks", "vector_store", "gateway_threads"),
]


@pytest.fixture
def client(queue: Queue) -> Client:
    token = token_create(queue=queue, name="app")[1]
    return Client(headers={"Authorization": f"Bearer {token}"})


def calls_logged(queue: Queue, *, waited_ms: int, count: int = 5, **fields: Any) -> None:
    """Answered calls of the queue, as the log keeps them: each waited `waited_ms` for a
    slot, read 500 prompt tokens in 5 s and wrote 50 in 5 s."""
    for _ in range(count):
        Call.objects.create(
            queue=queue,
            memory=Call.Memory.EMPTY,
            **{
                "source": Call.Source.MODEL,
                "upstream_ms": waited_ms + 10_000,
                "model_prompt_ms": 5_000,
                "model_generation_ms": 5_000,
                "prompt_tokens": 500,
                "completion_tokens": 50,
                **fields,
            },
        )


def test_a_long_prompt_the_busy_model_could_not_read_in_time_is_refused_at_once(
    queue: Queue, client: Client, upstream: FixedLatencyLLM, settings: Any
) -> None:
    """The model's calls wait 100 s for a slot and read a prompt token in 10 ms: a short
    prompt is answered within the 120 s deadline, one of about 2,500 tokens could not be."""
    settings.GATEWAY_CALL_DEADLINE_S = 120
    calls_logged(queue, waited_ms=100_000)
    assert ask(client).status_code == 200
    assert upstream.calls == 1
    long = [{"role": "user", "content": "Where is my card? " * 500}]
    for stream in (False, True):
        response = ask(client, messages=long, stream=stream)
        assert response.status_code == 503
        error = response.json()["error"]
        assert error["type"] == "upstream_error"
        assert "too busy to answer in time" in error["message"]
        assert "this one had" in error["message"]
        assert 1 <= int(response["Retry-After"]) <= 120
    assert upstream.calls == 1  # neither sent
    refused = Call.objects.filter(status_code=503)
    assert refused.count() == 2 and "GATEWAY_CALL_DEADLINE_S" in refused.first().error


def test_while_most_recent_calls_are_lost_to_the_deadline_calls_are_refused(
    queue: Queue, client: Client, upstream: FixedLatencyLLM, settings: Any
) -> None:
    """Lost calls report no times, but say the most: while most of the last minute's were
    lost, calls are refused at once, told to come back a deadline later; once those calls
    leave the window, calls go ahead again."""
    settings.GATEWAY_CALL_DEADLINE_S = 120
    calls_logged(queue, waited_ms=1_000, count=2)
    lost = {"status_code": 504, "upstream_ms": None, "model_prompt_ms": None}
    calls_logged(queue, waited_ms=0, count=3, **lost)
    for stream in (False, True):
        response = ask(client, stream=stream)
        assert response.status_code == 503
        assert "were lost to the deadline" in response.json()["error"]["message"]
        assert response["Retry-After"] == "120"
    assert upstream.calls == 0
    Call.objects.filter(status_code=504).update(
        created_at=timezone.now() - timedelta(seconds=pace.PACE_WINDOW_S + 1)
    )
    pace._read.clear()  # a second on
    assert ask(client).status_code == 200


def test_a_call_the_model_can_answer_in_time_goes_ahead(
    queue: Queue, client: Client, upstream: FixedLatencyLLM, settings: Any
) -> None:
    settings.GATEWAY_CALL_DEADLINE_S = 120
    calls_logged(queue, waited_ms=30_000)
    assert ask(client).status_code == 200
    assert upstream.calls == 1


def test_only_the_queues_recent_calls_to_its_model_tell_its_pace(queue: Queue) -> None:
    """Calls older than the window, calls refused or failed otherwise, memory answers and
    another queue's calls say nothing of the queue's pace now; nor do two calls alone."""
    lost = {"status_code": 504, "upstream_ms": None}
    long_ago = timezone.now() - timedelta(seconds=pace.PACE_WINDOW_S + 5)
    calls_logged(queue, waited_ms=0, created_at=long_ago, **lost)
    calls_logged(queue, waited_ms=0, status_code=503)
    calls_logged(queue, waited_ms=0, status_code=502)
    calls_logged(queue, waited_ms=0, source=Call.Source.MEMORY)
    calls_logged(QueueFactory(), waited_ms=0, **lost)
    calls_logged(queue, waited_ms=1_000, count=2)
    assert pace.queue_pace(queue.pk) is None


def test_the_pace_is_the_median_wait_and_the_tokens_speed(queue: Queue) -> None:
    calls_logged(queue, waited_ms=2_000, count=3)
    calls_logged(queue, waited_ms=90_000, count=2, completion_tokens=150)
    # A call asked twice, and a streamed one (no times): their whole upstream time is their
    # wait, and their tokens do not count in the speeds.
    calls_logged(queue, waited_ms=1_000, count=1, asks=2, prompt_tokens=10_000)
    calls_logged(queue, waited_ms=0, count=1, model_prompt_ms=None, upstream_ms=3_000)
    calls_logged(queue, waited_ms=0, count=1, status_code=504, upstream_ms=None)
    read = pace.queue_pace(queue.pk)
    assert read is not None and (read.calls, read.lost) == (8, 1)
    # Waits 2, 2, 2, 3, 11, 90, 90, inf: the lower median, 3 s.
    assert read.waited_s == 3.0 and not read.mostly_lost
    assert read.prompt_s_per_token == pytest.approx(25 / 2500)
    assert read.answer_s_per_token == pytest.approx(25 / 450)
    assert read.prompt_tokens_per_s == pytest.approx(100)
    assert read.answer_tokens == 50
    # A prompt of 1,000 tokens, an answer as long as the recent ones or as long as allowed.
    assert read.expected_s(prompt_tokens=1000, max_tokens=0) == pytest.approx(
        3 + 10 + 50 * 25 / 450
    )
    assert read.expected_s(prompt_tokens=1000, max_tokens=10) == pytest.approx(
        3 + 10 + 10 * 25 / 450
    )


def test_the_gateways_own_calls_give_the_pace(
    queue: Queue, client: Client, upstream: FixedLatencyLLM
) -> None:
    """What the gateway logs of its calls (the endpoint reports llama.cpp's times) is what
    the pace is read from."""
    for _ in range(3):
        assert ask(client).status_code == 200
    pace._read.clear()  # the calls read it within the second, before the first was logged
    read = pace.queue_pace(queue.pk)
    assert read is not None and (read.calls, read.lost) == (3, 0)
    assert read.answer_tokens == 12  # as the endpoint counts them
    assert read.waited_s < 5 and read.answer_tokens_per_s is not None


def test_a_process_reads_the_pace_at_most_once_a_second(
    queue: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = 1000.0
    monkeypatch.setattr(pace, "clock", lambda: now)
    assert pace.queue_pace(queue.pk) is None
    calls_logged(queue, waited_ms=1_000)
    assert pace.queue_pace(queue.pk) is None  # read within the second: as it was
    now += 1.5
    assert pace.queue_pace(queue.pk) is not None


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
