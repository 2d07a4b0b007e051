"""The one harness of the benchmarks and the fault suite: a throw-away world, a run inside it,
its result as JSON, and the percentiles every benchmark reports.

A world has its own database, Qdrant folder and broker queue, so a benchmark never touches the
data of a running install. Its database is a SQLite file, or a database created for the run
(and dropped after it) on a PostgreSQL server: the one `--database-url` names, else the
install's own when that is PostgreSQL. So benchmarks run on whichever database the install
uses.

A `WorldCommand` runs twice: outside, it builds the world (and whatever the world needs
started beside it: an LLM endpoint, a worker, a web server) and reports; inside (`--inner`,
in a child process configured for the world), it measures and returns a JSON-able result.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlparse, urlunparse

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from icrlhf.ops.catalogue import LOCAL_MODELS, LocalModel, local_model
from icrlhf.ops.models_build import ModelIntegrityError, local_llm_build
from icrlhf.ops.stack import (
    Child,
    Stack,
    call_log_writer_command,
    celery_worker_command,
    free_port,
    gateway_command,
    http_ok,
    wait_until,
    web_command,
)

ROOT = Path(__file__).resolve().parents[1]
MANAGE = [sys.executable, str(ROOT / "manage.py")]


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank percentile (q in 0–100); NaN for no values."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def database_url_of(database: Mapping[str, Any]) -> str:
    """The DATABASE_URL of a Django database (after the test runner renamed it, the test
    database's), for the processes a test or benchmark starts."""
    if database["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{database['NAME']}"
    credentials = quote(database.get("USER") or "", safe="")
    if database.get("PASSWORD"):
        credentials += ":" + quote(database["PASSWORD"], safe="")
    host = database.get("HOST") or "127.0.0.1"
    port = f":{database['PORT']}" if database.get("PORT") else ""
    at = "@" if credentials else ""
    return f"postgres://{credentials}{at}{host}{port}/{quote(database['NAME'], safe='')}"


@contextmanager
def world_database(folder: Path, server_url: str = "") -> Iterator[str]:
    """A scratch database for one world, yielded as its DATABASE_URL and dropped afterwards."""
    installed = settings.DATABASES["default"]
    if not server_url and installed["ENGINE"].endswith("postgresql"):
        server_url = database_url_of(installed)
    if not server_url:
        yield f"sqlite:///{folder / 'world.sqlite3'}"
        return
    import psycopg

    server = urlparse(server_url)
    if server.scheme not in {"postgres", "postgresql", "pgsql"}:
        raise ValueError(f"--database-url must be a PostgreSQL URL, not {server.scheme}://")
    name = f"icrlhf_world_{uuid.uuid4().hex[:12]}"
    admin_url = urlunparse(server._replace(scheme="postgresql"))
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield urlunparse(server._replace(path=f"/{name}"))
    finally:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def world_env(folder: Path, *, database_url: str, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "icrlhf.settings",
        "SECRET_KEY": settings.SECRET_KEY,
        "ICRLHF_VAR_DIR": str(folder),
        "EMBEDDING_MODEL_DIR": str(settings.EMBEDDING_MODEL_DIR),
        "DATABASE_URL": database_url,
        "QDRANT_URL": "",
        "QDRANT_PATH": str(folder / "qdrant"),
        "CELERY_QUEUE": f"icrlhf-bench-{uuid.uuid4().hex[:8]}",
        "LOG_LEVEL": "WARNING",
        # The benchmarks time the pipeline's own work, as they did before review had a share
        # of an endpoint; that share is proven by tests/integration/test_review_share.py.
        "REVIEW_GENERATION_MAX_CONCURRENT": "0",
        **extra,
    }


@dataclass
class World:
    folder: Path
    env: dict[str, str]
    stack: Stack

    def manage(self, *args: str) -> None:
        """`manage.py <args>` in a child process configured for this world."""
        subprocess.run([*MANAGE, *args], env=self.env, check=True, cwd=ROOT)

    def spawn(self, name: str, command: list[str]) -> Child:
        """A part of this world, stopped with it (log: <folder>/<name>.log)."""
        return self.stack.spawn(name, command, env=self.env)

    def worker(self, *, concurrency: int) -> Child:
        """A real Celery worker on the world's queue."""
        return self.spawn(
            "worker",
            celery_worker_command(
                "--concurrency", str(concurrency), "--without-mingle", "--without-gossip"
            ),
        )

    def web(self, *, port: int = 0, workers: int = 2) -> tuple[Child, str]:
        """The product's web server (gunicorn, as `make run` starts it) with its static files,
        once it answers; returns it and its base URL."""
        self.manage("collectstatic", "--noinput", "-v", "0")
        port = port or free_port()
        child = self.spawn("web", web_command(port, workers=workers))
        base = f"http://127.0.0.1:{port}"
        wait_until(lambda: http_ok(f"{base}/accounts/login/"), timeout_s=30, what="gunicorn")
        return child, base

    def gateway(self, *, port: int = 0) -> tuple[Child, str]:
        """The OpenAI-compatible gateway (uvicorn, as `make run` starts it) once it answers;
        returns it and its API base URL."""
        port = port or free_port()
        if not any(child.name == "call-log-writer" for child in self.stack.children):
            self.spawn("call-log-writer", call_log_writer_command())
        child = self.spawn("gateway", gateway_command(port))
        base = f"http://127.0.0.1:{port}"
        wait_until(lambda: http_ok(f"{base}/healthz"), timeout_s=60, what="the gateway")
        return child, f"{base}/v1"

    def inside(self, command: str, options: Mapping[str, Any]) -> Any:
        """Runs `manage.py <command> --inner` in this world with these options; its result."""
        (self.folder / "options.json").write_text(json.dumps(options, default=str))
        self.manage(command, "--inner", str(self.folder))
        return json.loads((self.folder / "result.json").read_text())


@contextmanager
def world(name: str, *, database_url: str = "", **env: str) -> Iterator[World]:
    """A migrated throw-away world; `env` adds settings for its processes. Everything started
    in it is stopped, and its database dropped, when the block ends."""
    with (
        tempfile.TemporaryDirectory(prefix=f"icrlhf-{name}-") as folder,
        world_database(Path(folder), database_url) as url,
    ):
        here = World(
            folder=Path(folder),
            env=world_env(Path(folder), database_url=url, **env),
            stack=Stack(log_dir=Path(folder) / "logs"),
        )
        try:
            here.manage("migrate", "--noinput", "-v", "0")
            yield here
        finally:
            here.stack.stop()


def add_llm_options(parser: CommandParser) -> None:
    """How a benchmark that asks an LLM is pointed at another one, unchanged: another model of
    the local catalogue, or any OpenAI-compatible endpoint and model (its key: LLM_API_KEY in
    the environment)."""
    parser.add_argument(
        "--local-llm",
        default="",
        choices=sorted(LOCAL_MODELS),
        metavar="NAME",
        help=(
            f"The local catalogue's model to start for this run, built first if it is not "
            f"yet ({', '.join(LOCAL_MODELS)}; default: LOCAL_LLM's)."
        ),
    )
    parser.add_argument(
        "--llm-api-base",
        default="",
        help="An OpenAI-compatible endpoint to ask instead (default: start the local LLM).",
    )
    parser.add_argument(
        "--llm-model",
        default="",
        help="The model at --llm-api-base, as litellm names it (default: the local LLM's).",
    )


def local_llm_chosen(options: Mapping[str, Any]) -> tuple[LocalModel, Path]:
    """The local model a benchmark starts and its file: `--local-llm`'s, built here when it
    is not yet (instant when this machine built it before), else LOCAL_LLM's."""
    name = options.get("local_llm") or ""
    if options.get("llm_api_base") and name:
        raise CommandError("--local-llm starts a local model; --llm-api-base asks another.")
    if not name:
        return local_model(settings.LOCAL_LLM), settings.LOCAL_LLM_MODEL_PATH
    model = local_model(name)
    try:
        path = local_llm_build(
            model, folder=settings.VAR_DIR / "models", cache=settings.MODEL_CACHE_DIR
        )
    except ModelIntegrityError as error:
        raise CommandError(str(error)) from error
    return model, path


@contextmanager
def llm_endpoint(
    options: Mapping[str, Any], *, slots: int = 4, threads: int | None = None
) -> Iterator[dict[str, str]]:
    """The settings (LLM_API_BASE, LLM_MODEL, and LOCAL_LLM for a local model) of the LLM a
    benchmark asks: the endpoint `--llm-api-base` names, else the local LLM (`--local-llm`'s
    or LOCAL_LLM's), started here (with `slots` requests at once, on `threads` threads,
    default the product's) and stopped when the block ends."""
    api_base = options.get("llm_api_base") or ""
    model, path = local_llm_chosen(options)
    chosen = {"LLM_MODEL": options.get("llm_model") or f"openai/{model.alias}"}
    local = Stack(log_dir=settings.VAR_DIR / "bench" / "logs")
    try:
        if not api_base:
            api_base = f"http://127.0.0.1:{free_port()}/v1"
            local.start_local_llm(api_base, path, model, slots=slots, threads=threads)
            chosen["LOCAL_LLM"] = model.name
        yield {"LLM_API_BASE": api_base, **chosen}
    finally:
        local.stop()


def add_reflector_options(parser: CommandParser) -> None:
    """Which model reflects on the playbook (default: the one that answers)."""
    parser.add_argument(
        "--reflector-local-llm",
        default="",
        choices=sorted(LOCAL_MODELS),
        metavar="NAME",
        help="The local catalogue's model to start as the reflector (REFLECTOR_MODEL).",
    )
    parser.add_argument(
        "--reflector-api-base", default="", help="An OpenAI-compatible endpoint to reflect."
    )
    parser.add_argument(
        "--reflector-model", default="", help="The model at --reflector-api-base, for litellm."
    )


@contextmanager
def reflector_endpoint(options: Mapping[str, Any]) -> Iterator[dict[str, str]]:
    """REFLECTOR_MODEL and REFLECTOR_API_BASE of `--reflector-local-llm` (started here) or
    `--reflector-api-base`; none when neither is given: the answering model reflects."""
    if not options.get("reflector_local_llm") and not options.get("reflector_api_base"):
        yield {}
        return
    asked = {
        "local_llm": options.get("reflector_local_llm"),
        "llm_api_base": options.get("reflector_api_base"),
        "llm_model": options.get("reflector_model"),
    }
    with llm_endpoint(asked, slots=1) as chosen:
        yield {"REFLECTOR_MODEL": chosen["LLM_MODEL"], "REFLECTOR_API_BASE": chosen["LLM_API_BASE"]}


def inside_with_local_llm(command: str, options: dict[str, Any]) -> dict[str, Any]:
    """Runs `command`'s measurement inside a world whose worker calls the real local LLM
    (or the endpoint `--llm-api-base` names: see `llm_endpoint`), reflecting with the
    reflector's options where the command has them, and adds the minutes the whole run
    took."""
    started = time.monotonic()
    with (
        llm_endpoint(options) as llm,
        reflector_endpoint(options) as reflector,
        world(command.replace("_", "-"), **llm, **reflector) as here,
    ):
        here.worker(concurrency=4)
        result = dict(here.inside(command, options))
    result["minutes"] = round((time.monotonic() - started) / 60, 1)
    return result


class WorldCommand(BaseCommand):
    """A benchmark measured inside a throw-away world: subclasses add their options, build the
    world in `outside` (usually `with world(...) as w: return w.inside(name, options)`),
    measure in `measure` and print in `report`. `--json` ends the output with the result."""

    def add_options(self, parser: CommandParser) -> None:
        """The command's own options."""

    def add_arguments(self, parser: CommandParser) -> None:
        self.add_options(parser)
        parser.add_argument("--json", action="store_true", help="End with one JSON line.")
        parser.add_argument("--inner", default="", help=argparse.SUPPRESS)

    def handle(self, *args: Any, **options: Any) -> None:
        if options["inner"]:
            folder = Path(options["inner"])
            inner_options = json.loads((folder / "options.json").read_text())
            (folder / "result.json").write_text(json.dumps(self.measure(inner_options)))
            return
        result = self.outside(options)
        self.report(result, options)
        if options["json"]:
            self.stdout.write(json.dumps(result, sort_keys=True))

    def outside(self, options: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def measure(self, options: dict[str, Any]) -> Any:
        raise NotImplementedError

    def report(self, result: dict[str, Any], options: dict[str, Any]) -> None:
        raise NotImplementedError
