"""An app calling the gateway of its queue "helpdesk", in this process, on a real local
endpoint of the test's own (FixedLatencyLLM: its calls counted, its latency set by the test).

Test modules import the fixtures under their functions' names (`upstream_fixture`,
`helpdesk_queue_fixture`), so a test's `upstream` and `queue` arguments shadow nothing.
"""

import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client

from icrlhf.queues.models import Queue
from tests.factories import QueueFactory
from tests.support.fixed_latency_llm import FixedLatencyLLM

CHAT_URL = "/v1/chat/completions"


@pytest.fixture(name="upstream")
def upstream_fixture() -> Iterator[FixedLatencyLLM]:
    server = FixedLatencyLLM(latency_s=0).start()
    yield server
    server.stop()


@pytest.fixture(name="queue")
def helpdesk_queue_fixture(upstream: FixedLatencyLLM) -> Queue:
    return QueueFactory(slug="helpdesk", api_base=upstream.api_base, model="openai/fixed")


def ask(client: Client, **body: Any) -> Any:
    """One chat completion for the queue "helpdesk": "Hi", with `body`'s fields over it."""
    payload = {"model": "helpdesk", "messages": [{"role": "user", "content": "Hi"}], **body}
    return client.post(CHAT_URL, json.dumps(payload), content_type="application/json")
