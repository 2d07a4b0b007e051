import signal
import time
from typing import Any
from urllib.parse import urlparse

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser

from icrlhf.ops.catalogue import local_model
from icrlhf.ops.demo import demo_login_ensure
from icrlhf.ops.local_llm import LocalLLMUnsupported, local_llm_check
from icrlhf.ops.stack import (
    LOOPBACK,
    call_log_writer_command,
    celery_worker_command,
    embedded_broker_command,
    gateway_command,
    http_ok,
    local_llm_command,
    port_open,
    web_command,
)
from icrlhf.ops.supervision import Part, Supervisor, tail

# Ctrl-C, `kill`, a closed terminal.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Command(BaseCommand):
    help = (
        "Run broker, local LLM, workers, web and gateway under supervisord: a part that dies is "
        "restarted and the others carry on; Ctrl-C stops them all."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument(
            "--gateway-port",
            type=int,
            default=None,
            help="The OpenAI-compatible gateway's port (default: the web port + 1).",
        )
        parser.add_argument(
            "--no-local-llm",
            action="store_true",
            help="Do not start the llama.cpp server (LLM_API_BASE points elsewhere).",
        )

    def say(self, text: str) -> None:
        self.stdout.write(text)
        self.stdout.flush()

    def handle(self, *args: Any, **options: Any) -> None:
        # supervisord runs in its own session (so a Ctrl-C reaches this process only, which
        # stops the parts in order): `kill`, a closed terminal or a service manager's stop
        # must take the same way out, or the parts would outlive the command.
        for stop_signal in STOP_SIGNALS:
            signal.signal(stop_signal, _stop_requested)
        # The web part serves the static files' manifest: a new var directory has none.
        call_command("collectstatic", interactive=False, verbosity=0)
        supervisor = Supervisor(
            run_dir=settings.VAR_DIR / "run", log_dir=settings.VAR_DIR / "log", say=self.say
        )
        readiness: list[tuple[str, Any, float]] = []
        broker = self._broker(supervisor, readiness)
        llm = self._llm(supervisor, readiness, local=not options["no_local_llm"])
        # Two workers: LLM calls in one, the vector store (which local mode lets one process
        # open) in the other, so retrievals never wait behind LLM calls.
        supervisor.add(
            Part(
                "worker",
                celery_worker_command(
                    "--queues",
                    settings.CELERY_TASK_DEFAULT_QUEUE,
                    "--hostname",
                    "worker@%h",
                    "--concurrency",
                    "8",
                    "--beat",
                    "--schedule",
                    str(settings.VAR_DIR / "celerybeat-schedule"),
                ),
                priority=30,
            )
        )
        supervisor.add(
            Part(
                "memory",
                celery_worker_command(
                    "--queues",
                    settings.CELERY_MEMORY_QUEUE,
                    "--hostname",
                    "memory@%h",
                    "--concurrency",
                    "4",
                ),
                priority=30,
            )
        )
        url = f"http://127.0.0.1:{options['port']}/"
        supervisor.add(Part("web", web_command(options["port"]), priority=40))
        readiness.append(("web", lambda: http_ok(f"{url}accounts/login/"), 60))
        gateway_port = options["gateway_port"] or options["port"] + 1
        gateway = f"http://127.0.0.1:{gateway_port}"
        supervisor.add(Part("gateway", gateway_command(gateway_port), priority=40))
        supervisor.add(Part("call-log-writer", call_log_writer_command(), priority=40))
        readiness.append(("gateway", lambda: http_ok(f"{gateway}/healthz"), 60))
        try:
            supervisor.start()
            for name, ready, timeout_s in readiness:
                self._wait_ready(supervisor, name, ready, timeout_s)
            login = demo_login_ensure()
            self.say(
                "\n"
                f"  icrlhf is running: open {url}\n"
                f"  Log in as {login.username} / {login.password}\n"
                f"  Apps: point an OpenAI client at {gateway}/v1 (model: a queue's slug, key: "
                "a queue's integration token)\n"
                f"  Broker: {broker}\n"
                f"  LLM: {llm}\n"
                f"  Logs: {supervisor.log_dir}/ (one per part; supervisord.log says what "
                "started and stopped)\n"
                "  A part that dies is restarted; the others carry on. Ctrl-C stops everything.\n"
            )
            while supervisor.running():
                time.sleep(0.5)
            raise CommandError(f"supervisord stopped; see {supervisor.log_dir / 'supervisord.log'}")
        except KeyboardInterrupt:
            pass
        finally:
            # A second Ctrl-C while the parts stop must not end this process first: supervisord
            # would lose its output and die, leaving the parts it had not yet stopped running.
            for stop_signal in STOP_SIGNALS:
                signal.signal(stop_signal, signal.SIG_IGN)
            self.say("Stopping… (each part has 15 s to finish its work)")
            supervisor.stop()

    def _broker(self, supervisor: Supervisor, readiness: list[tuple[str, Any, float]]) -> str:
        url = urlparse(settings.CELERY_BROKER_URL)
        host, port = url.hostname or "127.0.0.1", url.port or 6379
        if port_open(host, port):
            return f"Redis at {host}:{port} (already running)"
        if host not in LOOPBACK:
            raise CommandError(f"No broker answers at {settings.CELERY_BROKER_URL}")
        data_dir = settings.VAR_DIR / "broker"
        data_dir.mkdir(parents=True, exist_ok=True)
        supervisor.add(Part("broker", embedded_broker_command(port, data_dir), priority=10))
        readiness.append(("broker", lambda: port_open(host, port), 30))
        return f"embedded Valkey at {host}:{port}"

    def _llm(
        self, supervisor: Supervisor, readiness: list[tuple[str, Any, float]], *, local: bool
    ) -> str:
        api_base = settings.LLM_API_BASE
        url = urlparse(api_base)
        host, port = url.hostname or "127.0.0.1", url.port or 80
        if not local or host not in LOOPBACK:
            return f"{settings.LLM_MODEL} at {api_base}"
        if port_open(host, port):
            return f"LLM at {api_base} (already running)"
        try:
            local_llm_check()
        except LocalLLMUnsupported as error:
            raise CommandError(str(error)) from error
        path = settings.LOCAL_LLM_MODEL_PATH
        supervisor.add(
            Part(
                "llm",
                local_llm_command(
                    path,
                    model=local_model(settings.LOCAL_LLM),
                    port=port,
                    slots=settings.LOCAL_LLM_SLOTS,
                ),
                start_s=5,
                priority=20,
            )
        )
        readiness.append(("llm", lambda: http_ok(f"{api_base}/models"), 90))
        return (
            f"local llama.cpp server at {api_base} ({path.name}, "
            f"{settings.LOCAL_LLM_SLOTS} requests at once)"
        )

    def _wait_ready(self, supervisor: Supervisor, name: str, ready: Any, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():
            if not supervisor.running():
                raise CommandError(
                    f"supervisord stopped; see {supervisor.log_dir / 'supervisord.log'}"
                )
            if supervisor.ended(name) or time.monotonic() > deadline:
                last = "\n".join(f"    | {line}" for line in tail(supervisor.log_of(name)))
                raise CommandError(
                    f"{name} did not start within {timeout_s:.0f} s. "
                    f"Last lines of {supervisor.log_of(name)}:\n{last}"
                )
            time.sleep(0.2)


def _stop_requested(signum: int, frame: object) -> None:
    raise KeyboardInterrupt
