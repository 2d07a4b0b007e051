"""Test settings: the real settings, with a throw-away database and a queue of their own.

What is set in os.environ here reaches the worker processes the integration tests start, so
the test process and its workers share the database file, the broker queue and the broker.
"""

import os
import uuid
from pathlib import Path

_VAR = Path(__file__).resolve().parent.parent / "var"
_RUN = uuid.uuid4().hex[:8]
os.environ.setdefault("SECRET_KEY", "tests-only-" + "k" * 50)
os.environ.setdefault("DATABASE_URL", f"sqlite:///{_VAR / 'test' / f'db-{_RUN}.sqlite3'}")
os.environ.setdefault("CELERY_QUEUE", f"icrlhf-test-{_RUN}")
os.environ.setdefault("BROKER_URL", "redis://127.0.0.1:6379/15")
# Nothing reaches a real model by accident: tests that want one say where it is.
os.environ.setdefault("LLM_API_BASE", "http://127.0.0.1:9/v1")
os.environ.setdefault("LLM_MODEL", "openai/test-model")
os.environ.setdefault("QDRANT_PATH", str(_VAR / "test" / f"qdrant-{_RUN}"))
os.environ.setdefault("LLM_MAX_RETRIES", "2")
# The tests that start the local LLM need it fast, not good: the smallest model decodes about
# three times faster than the default Qwen2.5-Coder-0.5B on two cores. The default's own
# test (tests/integration/test_default_model.py) asks for it by name.
os.environ.setdefault("LOCAL_LLM", "smollm2-135m")
# The webhook receivers the tests start listen on 127.0.0.1 (a test refuses them explicitly).
os.environ.setdefault("WEBHOOK_ALLOW_PRIVATE", "1")
# One gateway process (uvicorn in its own, not a supervisor of workers): a test that stops or
# kills it stops the whole gateway. Two processes are what the benchmarks measure.
os.environ.setdefault("GATEWAY_PROCESSES", "1")

from icrlhf.settings import *  # noqa: E402, F403
from icrlhf.settings import DATABASES, VAR_DIR  # noqa: E402

if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # A file, not memory, so a worker process can open the same database.
    DATABASES["default"]["TEST"] = {"NAME": DATABASES["default"]["NAME"]}
    Path(DATABASES["default"]["NAME"]).parent.mkdir(parents=True, exist_ok=True)
else:
    # A test database of this run's own: two runs on one server never drop each other's.
    DATABASES["default"]["TEST"] = {"NAME": f"test_icrlhf_{_RUN}"}

# Counters per test process, never left behind in the machine's Redis.
CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}
TEST_VAR_DIR = VAR_DIR / "test"
STATIC_ROOT = TEST_VAR_DIR / "staticfiles"
STATIC_ROOT.mkdir(parents=True, exist_ok=True)
