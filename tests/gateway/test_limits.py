"""Limits one tenant cannot break at the gateway: calls in flight per token, and a deadline
per call. The upstream is the fixed-latency test double over HTTP, through litellm's real code
path. A stream that drips past the deadline is cut in the real gateway process
(test_endpoint.py): this process's test client reads a stream on another event loop."""

from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.test import Client

from icrlhf.gateway import limits
from icrlhf.gateway.models import Call
from icrlhf.ingest.models import IntegrationToken
from icrlhf.ingest.services import token_create
from icrlhf.queues.models import Queue
from tests.factories import QueueFactory
from tests.support.fixed_latency_llm import FixedLatencyLLM
from tests.support.gateway_app import ask, helpdesk_queue_fixture, upstream_fixture  # noqa: F401
from tests.support.waiting import wait_for

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.urls("icrlhf.gateway.urls"),
    pytest.mark.usefixtures("eager_tasks", "vector_store", "gateway_threads"),
]


def app_for(queue: Queue) -> tuple[Client, IntegrationToken]:
    record, token = token_create(queue=queue, name="app")
    return Client(headers={"Authorization": f"Bearer {token}"}), record


def events_of(response: Any) -> list[str]:  # for streams that need no upstream connection
    async def body() -> bytes:
        return b"".join([chunk async for chunk in response.streaming_content])

    text = async_to_sync(body)().decode()
    return [line.removeprefix("data: ") for line in text.split("\n\n") if line]


def in_flight(token: IntegrationToken) -> int:
    """What the token holds now: a probe takes a slot (or is refused) and gives it back."""
    held = 0
    probes = []
    while (probe := limits.in_flight_acquire(token.pk)) is not None:
        probes.append(probe)
        held += 1
    for probe in probes:
        limits.in_flight_release(probe)
    return 3 - held  # the cap the tests set


def test_a_token_past_its_calls_in_flight_is_refused_until_one_ends(
    queue: Queue, upstream: FixedLatencyLLM, settings: Any
) -> None:
    settings.GATEWAY_MAX_IN_FLIGHT_PER_TOKEN = 3
    client, token = app_for(queue)
    elsewhere = QueueFactory(slug="elsewhere", api_base=upstream.api_base, model="openai/fixed")
    other_client, _ = app_for(elsewhere)
    held = [limits.in_flight_acquire(token.pk) for _ in range(3)]
    assert all(held)

    refused = ask(client)
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "too_many_in_flight"
    assert refused["Retry-After"] == "1"
    assert not Call.objects.exists()  # refused before the plan: nothing retrieved, no row
    # Another tenant's token is not held back by this one.
    assert ask(other_client, model="elsewhere").status_code == 200

    limits.in_flight_release(held.pop())
    assert ask(client).status_code == 200
    assert in_flight(token) == 2  # the answered call gave its slot back


def test_every_way_out_gives_the_slot_back(
    queue: Queue, upstream: FixedLatencyLLM, settings: Any
) -> None:
    settings.GATEWAY_MAX_IN_FLIGHT_PER_TOKEN = 3
    client, token = app_for(queue)
    assert ask(client).status_code == 200
    assert ask(client, stream=True)["Content-Type"] == "text/event-stream"  # never read
    streamed = ask(client, stream=True)
    assert events_of(streamed)[-1] == "[DONE]"
    wait_for(lambda: in_flight(token) == 1, what="the read stream's slot to come back")
    queue.api_base = "http://127.0.0.1:9/v1"  # nothing listens: the upstream fails
    queue.save()
    assert ask(client).status_code == 502
    assert ask(client, stream=True).status_code == 502
    # Only the stream nobody read still holds its slot, until its bucket ages out.
    assert in_flight(token) == 1


def test_a_bucket_older_than_the_deadline_no_longer_counts(
    queue: Queue, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slot never given back (a process killed mid-call) drops out by itself."""
    settings.GATEWAY_MAX_IN_FLIGHT_PER_TOKEN = 3
    settings.GATEWAY_CALL_DEADLINE_S = 60
    _client, token = app_for(queue)
    now = 1_000_000.0
    monkeypatch.setattr(limits, "clock", lambda: now)
    for _ in range(3):
        assert limits.in_flight_acquire(token.pk) is not None
    assert limits.in_flight_acquire(token.pk) is None
    now += 60 + 2 * limits.BUCKET_S
    assert limits.in_flight_acquire(token.pk) is not None


def test_a_slow_upstream_gets_a_504_at_the_deadline(
    queue: Queue, upstream: FixedLatencyLLM, settings: Any
) -> None:
    client, _token = app_for(queue)
    assert ask(client).status_code == 200  # the embedding model loaded: the time is upstream's
    settings.GATEWAY_CALL_DEADLINE_S = 1
    upstream.latency_s = 4
    answered = upstream.calls  # counted as the upstream answers, after its latency
    response = ask(client)
    # Cut at the deadline: the caller has its 504 before the upstream has answered.
    assert upstream.calls == answered
    assert response.status_code == 504
    assert "GATEWAY_CALL_DEADLINE_S" in response.json()["error"]["message"]
    (cut,) = Call.objects.filter(status_code=504)
    assert "GATEWAY_CALL_DEADLINE_S" in cut.error  # the call's row says why it ended
