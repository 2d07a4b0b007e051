"""The gateway as installs run it: two processes (GATEWAY_PROCESSES' default on two cores),
where every other test runs one, and the call log's writer in a process of its own
(CALL_LOG_WRITER's default). Calls answered by each process are logged, through the journal on
the machine's Redis, in the order they were made; stopping the gateway stops both processes;
the writer, stopped, writes what waits before it ends."""

import http.client
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
from django.utils import timezone

from icrlhf.gateway.models import Call
from icrlhf.ingest.models import IntegrationToken
from icrlhf.ingest.services import token_create
from icrlhf.queues.models import Queue
from tests.factories import QueueFactory
from tests.support.caches import cache_in_redis
from tests.support.fixed_latency_llm import FixedLatencyLLM
from tests.support.processes import (
    CallLogWriterProcess,
    GatewayProcess,
    production_gateway_env,
)
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

MAX_CALLS = 40  # until each process has answered one; the kernel hands connections out


def _asked(
    port: int, body: dict[str, Any], token: str, *, status: int = 200
) -> http.client.HTTPConnection:
    """Makes one call on a connection of its own, answered `status`; the connection, still
    open."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    connection.request(
        "POST",
        "/v1/chat/completions",
        body=json.dumps(body),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    response = connection.getresponse()
    assert response.status == status, response.read()
    response.read()
    return connection


def _served_by(
    port: int,
    body: dict[str, Any],
    token: str,
    processes: list[psutil.Process],
    *,
    status: int = 200,
) -> int:
    """Makes one call; the pid of the process that answered it (the one holding the
    connection's other end, kept alive after the answer)."""
    connection = _asked(port, body, token, status=status)
    try:
        assert connection.sock is not None
        client_port = connection.sock.getsockname()[1]
        (pid,) = [
            process.pid
            for process in processes
            if any(c.raddr and c.raddr.port == client_port for c in process.net_connections())
        ]
        return pid
    finally:
        connection.close()


def _serving(parent: int) -> list[psutil.Process] | None:
    """The two processes uvicorn started to serve (beside multiprocessing's resource
    tracker), once both are up."""
    serving = [
        child
        for child in psutil.Process(parent).children()
        if "spawn_main" in " ".join(child.cmdline())
    ]
    return serving if len(serving) == 2 else None


def _each_process_answers(
    port: int,
    body_of: Callable[[int], dict[str, Any]],
    token: str,
    processes: list[psutil.Process],
    *,
    status: int,
) -> int:
    """Makes calls (the nth with `body_of(n)`), each answered `status`, until each process
    has answered one; how many it made."""
    served: list[int] = []
    while len(set(served)) < 2 and len(served) < MAX_CALLS:
        served.append(_served_by(port, body_of(len(served)), token, processes, status=status))
    assert len(set(served)) == 2, f"one process answered all {len(served)} calls"
    return len(served)


def _desk(settings: Any, upstream: FixedLatencyLLM) -> tuple[Any, str, dict[str, str]]:
    """A queue and its app's token, and the environment its gateway and call-log writer run
    in as installs run them: the journal on the machine's Redis, the writer a process."""
    prefix = cache_in_redis(settings)
    queue = QueueFactory(slug="desk", capture_below_similarity=None)
    token = token_create(queue=queue, name="app")[1]
    env = {
        **production_gateway_env(settings, cache_prefix=prefix, llm_api_base=upstream.api_base),
        "CALL_LOG_WRITER": "process",
    }
    return queue, token, env


def test_calls_through_each_of_two_gateway_processes_are_logged_in_order_and_stop_together(
    tmp_path: Path, settings: Any
) -> None:
    upstream = FixedLatencyLLM(latency_s=0.05).start()
    queue, token, env = _desk(settings, upstream)
    gateway = GatewayProcess(env=env, log=tmp_path / "gateway.log", processes=2)
    writer = CallLogWriterProcess(env=env, log=tmp_path / "writer.log")
    try:
        gateway.wait_ready()
        processes = wait_for(lambda: _serving(gateway.process.pid), what="two processes")
        calls = _each_process_answers(
            gateway.port,
            lambda n: {"model": "desk", "messages": [{"role": "user", "content": f"Q{n}"}]},
            token,
            processes,
            status=200,
        )

        logged = Call.objects.filter(queue=queue).order_by("created_at", "pk")
        wait_for(lambda: logged.count() == calls, what="every call in the log")
        assert [call.request_text for call in logged] == [f"Q{n}" for n in range(calls)]
    finally:
        gateway.stop()
        writer.stop()
        upstream.stop()
    gone, alive = psutil.wait_procs(processes, timeout=15)
    assert alive == [] and len(gone) == 2
    assert writer.process.returncode == 0, writer.log.read_text()[-3000:]


def test_a_queue_changed_or_a_token_revoked_elsewhere_is_read_by_both_processes_at_once(
    tmp_path: Path, settings: Any
) -> None:
    """Each gateway process keeps the token rows it authenticated (ingest.services): a
    change made by another process (the web app, an admin) is seen by both at their next
    call, through the stamps in the machine's Redis."""
    upstream = FixedLatencyLLM(latency_s=0.01).start()
    queue, token, env = _desk(settings, upstream)
    gateway = GatewayProcess(
        env=env | {"CALL_LOG_WRITER": "gateway"}, log=tmp_path / "gateway.log", processes=2
    )
    body = {"model": "desk", "messages": [{"role": "user", "content": "Hello?"}]}
    try:
        gateway.wait_ready()
        processes = wait_for(lambda: _serving(gateway.process.pid), what="two processes")
        renamed = body | {"model": "desk-renamed"}
        _each_process_answers(gateway.port, lambda _: body, token, processes, status=200)

        Queue.objects.filter(pk=queue.pk).update(slug="desk-renamed")
        _each_process_answers(gateway.port, lambda _: body, token, processes, status=404)
        _each_process_answers(gateway.port, lambda _: renamed, token, processes, status=200)

        IntegrationToken.objects.filter(queue=queue).update(revoked_at=timezone.now())
        _each_process_answers(gateway.port, lambda _: body, token, processes, status=401)
    finally:
        gateway.stop()
        upstream.stop()


def test_the_call_log_writer_writes_what_waited_for_it_and_stops_when_told(
    tmp_path: Path, settings: Any
) -> None:
    """Calls answered while no writer runs wait in the journal (the gateway does not write
    them itself); the writer, once started, writes them in order, and SIGTERM stops it."""
    upstream = FixedLatencyLLM(latency_s=0.01).start()
    queue, token, env = _desk(settings, upstream)
    gateway = GatewayProcess(env=env, log=tmp_path / "gateway.log", processes=1)
    try:
        gateway.wait_ready()
        for n in range(3):
            body = {"model": "desk", "messages": [{"role": "user", "content": f"Q{n}"}]}
            _asked(gateway.port, body, token).close()
    finally:
        gateway.stop()
        upstream.stop()
    assert Call.objects.filter(queue=queue).count() == 0  # nobody wrote them: they waited

    writer = CallLogWriterProcess(env=env, log=tmp_path / "writer.log")
    try:
        logged = Call.objects.filter(queue=queue).order_by("created_at", "pk")
        wait_for(lambda: logged.count() == 3, what="the waiting calls in the log")
        assert [call.request_text for call in logged] == ["Q0", "Q1", "Q2"]
    finally:
        writer.stop()
    assert writer.process.returncode == 0, writer.log.read_text()[-3000:]
