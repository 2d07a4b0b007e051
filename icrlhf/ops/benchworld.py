"""A throw-away world for benchmarks: its own database, Qdrant folder and broker queue, so a
benchmark never touches the data of a running install.

The world's database is a SQLite file, or a database created for the run (and dropped after
it) on a PostgreSQL server: the one `--database-url` names, else the install's own when that
is PostgreSQL. So benchmarks and the fault suite run on whichever database the install uses."""

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlparse, urlunparse

from django.conf import settings

from icrlhf.ops.stack import celery_worker_command

ROOT = Path(__file__).resolve().parents[2]
MANAGE = [sys.executable, str(ROOT / "manage.py")]


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
        **extra,
    }


def world_migrate(env: dict[str, str]) -> None:
    subprocess.run([*MANAGE, "migrate", "--noinput", "-v", "0"], env=env, check=True)


def manage_run(env: dict[str, str], *args: str) -> None:
    subprocess.run([*MANAGE, *args], env=env, check=True)


@contextmanager
def world_worker(env: dict[str, str], folder: Path, *, concurrency: int) -> Iterator[None]:
    """A real Celery worker on the world's queue while the block runs (log: worker.log)."""
    with (folder / "worker.log").open("wb") as log:
        worker = subprocess.Popen(
            celery_worker_command(
                "--concurrency", str(concurrency), "--without-mingle", "--without-gossip"
            ),
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            yield
        finally:
            worker.terminate()
            worker.wait(timeout=30)
