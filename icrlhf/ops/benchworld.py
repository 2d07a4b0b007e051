"""A throw-away world for benchmarks: its own SQLite file, Qdrant folder and broker queue,
so a benchmark never touches the data of a running install."""

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from django.conf import settings

from icrlhf.ops.stack import celery_worker_command

ROOT = Path(__file__).resolve().parents[2]
MANAGE = [sys.executable, str(ROOT / "manage.py")]


def world_env(folder: Path, *, database_url: str = "", **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "icrlhf.settings",
        "SECRET_KEY": settings.SECRET_KEY,
        "ICRLHF_VAR_DIR": str(folder),
        "EMBEDDING_MODEL_DIR": str(settings.EMBEDDING_MODEL_DIR),
        "DATABASE_URL": database_url or f"sqlite:///{folder / 'bench.sqlite3'}",
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
