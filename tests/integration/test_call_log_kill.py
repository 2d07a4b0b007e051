"""The real gateway process, its log written after each answer through the journal on the
machine's Redis, killed with SIGKILL in the middle of a burst of calls: every call it answered
is in the log afterwards, with its run's step (written by the worker's sweep once the dead
writer's lock has expired), and none twice."""

import json
import threading
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from icrlhf.gateway import call_log
from icrlhf.gateway.models import Call
from icrlhf.ingest.services import token_create
from icrlhf.trajectories.models import Step
from tests.factories import QueueFactory
from tests.support.caches import cache_in_redis
from tests.support.fixed_latency_llm import FixedLatencyLLM
from tests.support.processes import GatewayProcess, production_gateway_env
from tests.support.waiting import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

CLIENTS, CALLS_EACH = 16, 4
KILL_AFTER = 12  # answers


def test_every_call_answered_before_the_gateway_is_killed_is_in_the_log(
    tmp_path: Path, settings: Any
) -> None:
    # The gateway process and this test share the cache's Redis, under this test's prefix.
    prefix = cache_in_redis(settings)
    queue = QueueFactory(slug="desk", capture_below_similarity=None)
    token = token_create(queue=queue, name="app")[1]
    upstream = FixedLatencyLLM(latency_s=0.2).start()
    gateway = GatewayProcess(
        env={
            **production_gateway_env(settings, cache_prefix=prefix, llm_api_base=upstream.api_base),
            "GATEWAY_PROCESSES": "1",
        },
        log=tmp_path / "gateway.log",
    )
    answered: list[str] = []
    enough = threading.Event()

    def call(n: int) -> None:
        body = {"model": "desk", "messages": [{"role": "user", "content": f"Question {n}"}]}
        request = urllib.request.Request(
            f"{gateway.base_url}/chat/completions",
            data=json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                answered.append(response.headers["X-Icrlhf-Call"])
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return  # cut off by the kill: never answered, so nothing is owed
        if len(answered) >= KILL_AFTER:
            enough.set()

    try:
        gateway.wait_ready()
        with ThreadPoolExecutor(CLIENTS) as clients:
            for n in range(CLIENTS * CALLS_EACH):
                clients.submit(call, n)
            assert enough.wait(timeout=60), gateway.log.read_text()[-3000:]
            gateway.process.kill()  # SIGKILL: no atexit, no drain
        gateway.process.wait()
    finally:
        gateway.stop()
        upstream.stop()

    killed_mid_burst = len(answered) < CLIENTS * CALLS_EACH
    assert killed_mid_burst and len(answered) >= KILL_AFTER

    def all_logged() -> bool:
        call_log.journal_sweep()  # the worker's periodic sweep: nothing until the lock expires
        return Call.objects.filter(pk__in=answered).count() == len(answered)

    wait_for(all_logged, timeout_s=40, what="every answered call in the log")
    assert Step.objects.filter(call_id__in=answered).count() == len(answered)
    assert Call.objects.filter(queue=queue).count() <= CLIENTS * CALLS_EACH
