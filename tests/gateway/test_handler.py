"""The gateway's ASGI handler starts no thread per call (Django's own starts one for its
security middleware and the response's close), and still sets the security headers."""

import asyncio
import threading
from typing import Any

import pytest
from django.core.handlers.asgi import ASGIHandler

from icrlhf.gateway.handler import GatewayHandler

# A call without a token reads nothing, but the gateway's pool threads check the database
# connections they kept from earlier tests before each piece of work.
pytestmark = pytest.mark.django_db

CALLS = 5


@pytest.fixture
def gateway_settings(settings: Any) -> None:
    settings.ROOT_URLCONF = "icrlhf.gateway.urls"
    settings.MIDDLEWARE = ["icrlhf.gateway.handler.SecurityHeaders"]
    settings.SECURE_CONTENT_TYPE_NOSNIFF = True


async def _called(handler: ASGIHandler) -> tuple[int, dict[bytes, bytes]]:
    """One call without a token (answered 401 without the database): its status and
    headers."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": "/v1/models",
        "raw_path": b"/v1/models",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"testserver")],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8001),
    }
    sent: list[dict[str, Any]] = []
    delivered = False

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await asyncio.Event().wait()  # the client stays connected
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await handler(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    return start["status"], {name.lower(): value for name, value in start["headers"]}


def _threads_started(handler: ASGIHandler, monkeypatch: pytest.MonkeyPatch) -> int:
    """Threads started by CALLS calls in one event loop, as uvicorn runs them, after two
    calls that start what every process starts once (the gateway's pool, the loop's)."""
    started: list[threading.Thread] = []
    start = threading.Thread.start

    def counted(thread: threading.Thread) -> None:
        started.append(thread)
        start(thread)

    async def calls() -> None:
        for _ in range(2):
            await _called(handler)
        monkeypatch.setattr(threading.Thread, "start", counted)
        for _ in range(CALLS):
            status, headers = await _called(handler)
            assert status == 401
            assert headers[b"x-content-type-options"] == b"nosniff"
        monkeypatch.undo()

    asyncio.run(calls())
    return len(started)


@pytest.mark.usefixtures("gateway_settings")
def test_the_gateway_starts_no_thread_per_call_and_keeps_the_security_headers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert _threads_started(GatewayHandler(), monkeypatch) == 0
    # What it spares: Django's handler starts one a call (the test would see it).
    assert _threads_started(ASGIHandler(), monkeypatch) >= CALLS
