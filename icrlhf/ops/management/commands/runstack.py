from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from icrlhf.ops.demo import demo_login_ensure
from icrlhf.ops.stack import Stack


class Command(BaseCommand):
    help = "Run broker, local LLM, worker and web together; Ctrl-C stops them all."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument(
            "--no-local-llm",
            action="store_true",
            help="Do not start the llama.cpp server (LLM_API_BASE points elsewhere).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        log_dir = settings.VAR_DIR / "log"
        stack = Stack(log_dir=log_dir)
        code = 1
        try:
            broker = stack.start_broker(settings.CELERY_BROKER_URL, settings.VAR_DIR / "broker")
            if options["no_local_llm"]:
                llm = f"{settings.LLM_MODEL} at {settings.LLM_API_BASE}"
            else:
                llm = stack.start_local_llm(
                    settings.LLM_API_BASE, settings.LOCAL_LLM_MODEL_PATH, alias="smollm2"
                )
            stack.start_worker(settings.VAR_DIR / "celerybeat-schedule")
            url = stack.start_web(options["port"])
            login = demo_login_ensure()
            self.stdout.write(
                "\n"
                f"  icrlhf is running: open {url}\n"
                f"  Log in as {login.username} / {login.password}\n"
                f"  Broker: {broker}\n"
                f"  LLM: {llm}\n"
                f"  Logs: {log_dir}/ (web, worker, llm)\n"
                "  Press Ctrl-C to stop everything.\n"
            )
            self.stdout.flush()
            code = stack.wait()
        finally:
            self.stdout.write("Stopping…")
            stack.stop()
        raise SystemExit(code)
