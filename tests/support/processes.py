"""The product's own processes, started for the integration tests: a Celery worker and the
gateway, each in its own process on the tests' database and the real broker."""

import os
import subprocess
import uuid
from pathlib import Path
from typing import Any

from bench.world import database_url_of
from icrlhf.ops.stack import (
    call_log_writer_command,
    celery_worker_command,
    free_port,
    gateway_command,
    http_ok,
)
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]

# Short enough that the timeout test waits little, long enough for every other call.
GATEWAY_LLM_TIMEOUT_S = 3


class _TestProcess:
    """One of the product's processes, started with the tests' settings and environment, its
    output in `log`; `stop` ends it, killed if it does not stop within 15 s."""

    def __init__(self, command: list[str], *, env: dict[str, str], log: Path) -> None:
        self.log = log
        self._log_stream = log.open("wb")
        self.process = subprocess.Popen(
            command,
            cwd=ROOT,
            env={**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", **env},
            stdout=self._log_stream,
            stderr=subprocess.STDOUT,
        )

    def _alive(self, what: str) -> None:
        if self.process.poll() is not None:
            raise AssertionError(f"{what} exited: {self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._log_stream.close()


class WorkerProcess(_TestProcess):
    """A real Celery worker in its own process, on the real broker, with its own Qdrant folder."""

    def __init__(self, *, env: dict[str, str], log: Path) -> None:
        self.name = f"test-{uuid.uuid4().hex[:8]}@localhost"
        super().__init__(
            celery_worker_command(
                "--concurrency",
                "10",
                "--hostname",
                self.name,
                "--without-mingle",
                "--without-gossip",
            ),
            env=env,
            log=log,
        )

    def wait_ready(self, timeout_s: float = 60) -> None:
        from worker import app

        def ready() -> bool:
            self._alive("The worker")
            return bool(app.control.ping(destination=[self.name], timeout=0.5))

        wait_for(ready, timeout_s=timeout_s, what="the Celery worker")


class GatewayProcess(_TestProcess):
    """The real gateway (uvicorn, ASGI) in its own process, on the tests' database. Its
    retrievals go through the session's worker, which owns the embedded store."""

    def __init__(self, *, env: dict[str, str], log: Path, processes: int = 0) -> None:
        """`processes`: how many (0: GATEWAY_PROCESSES, which the tests' settings set to 1)."""
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        super().__init__(gateway_command(self.port, workers=processes), env=env, log=log)

    def wait_ready(self, timeout_s: float = 60) -> None:
        def ready() -> bool:
            self._alive("The gateway")
            return http_ok(f"http://127.0.0.1:{self.port}/healthz")

        wait_for(ready, timeout_s=timeout_s, what="the gateway")


class CallLogWriterProcess(_TestProcess):
    """The call log's writer in its own process (`manage.py call_log_writer`), as make run
    starts it beside the gateway."""

    def __init__(self, *, env: dict[str, str], log: Path) -> None:
        super().__init__(call_log_writer_command(), env=env, log=log)


def production_gateway_env(
    settings: Any, *, cache_prefix: str, llm_api_base: str
) -> dict[str, str]:
    """A gateway process's environment as production configures it (the product's settings,
    its cache in the machine's Redis under `cache_prefix`, so the call log goes through the
    journal), on the tests' database, its upstream at `llm_api_base`; retrieval, with no
    worker to ask, gives up after 1 s."""
    return {
        "DJANGO_SETTINGS_MODULE": "icrlhf.settings",
        "CELERY_QUEUE": cache_prefix,  # the cache's key prefix
        "CACHE_URL": settings.CELERY_BROKER_URL,
        "DATABASE_URL": database_url_of(settings.DATABASES["default"]),
        "LLM_API_BASE": llm_api_base,
        "GATEWAY_RECALL_TIMEOUT_S": "1",
        # Each gateway process writes its own log, as a gateway run alone does: the writer's
        # own process is started where a test is about it (CallLogWriterProcess).
        "CALL_LOG_WRITER": "gateway",
    }
