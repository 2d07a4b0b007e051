import contextlib
import functools
import shutil
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connection
from django.test import Client

from bench.world import database_url_of
from icrlhf.integrations import llm, vectors
from icrlhf.ops.stack import Stack
from tests.factories import QueueFactory, UserFactory
from tests.support.caches import cache_in_redis
from tests.support.fixed_latency_llm import FixedLatencyLLM
from tests.support.llm_answer import LLMAnswer
from tests.support.processes import (
    GATEWAY_LLM_TIMEOUT_S,
    GatewayProcess,
    WorkerProcess,
)
from tests.support.recall_double import recall_answered_here

ROOT = Path(__file__).resolve().parent.parent

# The slow tiers (pyproject's markers), put on by what a test needs rather than by hand, so a
# new test lands in its tier by where it is, which fixtures it takes and whether its module
# starts other processes. `make test-fast` runs the tests that end up with none of them;
# `make test` runs them all.
TIER_OF_FOLDER = {"integration": "integration", "bench": "bench"}
TIER_OF_FIXTURE = {
    "worker_process": "integration",
    "gateway_process": "integration",
    "live_server": "integration",
    "browser": "browser",  # tests/integration/conftest.py: Chromium through Playwright
}
# A module holding one of these runs other programs (a fresh Python costs seconds of imports).
PROCESS_STARTERS = ("subprocess", "fresh_process_output")


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by these markers
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    tests = ROOT / "tests"
    for item in items:
        tiers = {
            tier
            for fixture, tier in TIER_OF_FIXTURE.items()
            if fixture in getattr(item, "fixturenames", ())
        }
        folder = item.path.relative_to(tests).parts[0] if item.path.is_relative_to(tests) else ""
        if folder in TIER_OF_FOLDER:
            tiers.add(TIER_OF_FOLDER[folder])
        module = getattr(item, "module", None)
        if any(hasattr(module, name) for name in PROCESS_STARTERS):
            tiers.add("integration")
        for tier in sorted(tiers):
            item.add_marker(tier)
    _other_databases_deselect(config, items)


def _other_databases_deselect(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test of one database's own behaviour (marked `postgresql` or `sqlite`) is left out of
    the other database's run, as deselected rather than skipped: `make test` runs the suite on
    both, so each such test runs once, where it can fail. The benchmarks' commands (`bench`)
    and the browser walkthroughs (`browser`) run in the SQLite pass only: what they assert (a
    benchmark's figures and report, a page's layout and keys) is not the database's, the unit,
    integration and fault tiers test the same code on PostgreSQL, and with them the whole run
    would have taken about 95 of CI's 90 minutes on a slower machine (estimated)."""
    other = {
        "postgresql": {"sqlite", "bench", "browser"},
        "sqlite": {"postgresql"},
    }[connection.vendor]
    kept = [item for item in items if not any(item.get_closest_marker(marker) for marker in other)]
    if len(kept) < len(items):
        config.hook.pytest_deselected(items=[i for i in items if i not in kept])
        items[:] = kept


@pytest.fixture(autouse=True)
def _fresh_rate_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts with no login or API attempts counted (the cache is per process),
    in one fixed one-minute window (30 s into it), so counts never reset mid-test."""
    from django.core.cache import cache

    from icrlhf.accounts import ratelimit

    cache.clear()
    pinned = (time.time() // ratelimit.WINDOW_S) * ratelimit.WINDOW_S + 30
    monkeypatch.setattr(ratelimit, "clock", lambda: pinned)


@pytest.fixture(autouse=True)
def _fresh_model_pace() -> None:
    """Each test reads a model's pace from its own calls: none an earlier test logged stays
    in this process's read of the last second (gateway/pace.py)."""
    from icrlhf.gateway import pace

    pace._read.clear()


@pytest.fixture
def llm_answer(monkeypatch: pytest.MonkeyPatch) -> LLMAnswer:
    """Makes the LLM module answer a given text (or raise, for "litellm.RateLimitError") through
    litellm's own offline switch, `mock_response`: litellm's real code path, no network."""
    real = {
        name: getattr(llm, name) for name in ("complete", "acomplete", "acomplete_n", "astream")
    }

    def answer(text: str) -> None:
        for name, call in real.items():
            monkeypatch.setattr(llm, name, functools.partial(call, mock_response=text))

    return answer


@pytest.fixture
def user(db: None) -> Any:
    return UserFactory()


@pytest.fixture
def logged_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def queue(db: None, user: Any) -> Any:
    """A queue the `user` fixture reviews."""
    return QueueFactory(members=[user])


@pytest.fixture
def vector_store(tmp_path: Path, settings: Any) -> Iterator[Path]:
    """A real Qdrant local store in a fresh folder, owned by this test process."""
    vectors.close()
    settings.QDRANT_URL = ""
    settings.QDRANT_PATH = tmp_path / "qdrant"
    yield settings.QDRANT_PATH
    vectors.close()


@pytest.fixture
def redis_cache(settings: Any) -> str:
    return cache_in_redis(settings)


@pytest.fixture(scope="session")
def fixed_llm() -> Iterator[FixedLatencyLLM]:
    llm = FixedLatencyLLM(latency_s=0.05).start()
    yield llm
    llm.stop()


@pytest.fixture(scope="session")
def worker_process(
    django_db_setup: None,
    django_db_blocker: Any,
    fixed_llm: FixedLatencyLLM,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[WorkerProcess]:
    """One worker for the session, talking to the fixed-latency LLM over real HTTP."""
    folder = tmp_path_factory.mktemp("worker")
    worker = WorkerProcess(
        env={
            "LLM_API_BASE": fixed_llm.api_base,
            "QDRANT_PATH": str(folder / "qdrant"),
            # pytest-django made a test copy of the database (PostgreSQL's test_<name>):
            # the worker must write where the tests read.
            "DATABASE_URL": database_url_of(settings.DATABASES["default"]),
        },
        log=folder / "worker.log",
    )
    try:
        worker.wait_ready()
        yield worker
    finally:
        worker.stop()


@pytest.fixture(autouse=True)
def _session_worker_settles(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test that used the session's worker ends once the worker has done what the test
    started (generations, their rankings, indexing): the test database is emptied next, and
    on PostgreSQL that TRUNCATE deadlocks with a worker's open transaction. Best effort: work
    the test left unfinishable on purpose (a stopped model) is not waited for past a bound.

    pytest-django's database fixtures are set up before this one (a plugin's autouse
    fixtures come first), so this teardown runs before theirs."""
    yield
    if "worker_process" not in request.fixturenames:
        return
    from django.db.models import Q

    from icrlhf.generation.models import Generation
    from icrlhf.memory.models import Example

    unfinished = Generation.objects.filter(
        Q(
            status__in=[
                Generation.Status.PENDING,
                Generation.Status.PREPARING,
                Generation.Status.RUNNING,
            ]
        )
        | Q(status=Generation.Status.DONE, ranked_at__isnull=True)
    )
    unindexed = Example.objects.filter(index_state=Example.IndexState.PENDING)
    deadline = time.monotonic() + 15
    while (unfinished.exists() or unindexed.exists()) and time.monotonic() < deadline:
        time.sleep(0.1)


@pytest.fixture(scope="session")
def gateway_process(
    worker_process: WorkerProcess,
    fixed_llm: FixedLatencyLLM,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[GatewayProcess]:
    folder = tmp_path_factory.mktemp("gateway")
    gateway = GatewayProcess(
        env={
            "LLM_API_BASE": fixed_llm.api_base,
            "LLM_TIMEOUT_S": str(GATEWAY_LLM_TIMEOUT_S),
            "DATABASE_URL": database_url_of(settings.DATABASES["default"]),
            "GATEWAY_RECALL_TIMEOUT_S": "10",  # the worker's first retrieval loads its model
        },
        log=folder / "gateway.log",
    )
    try:
        gateway.wait_ready()
        yield gateway
    finally:
        gateway.stop()


@pytest.fixture(scope="session", autouse=True)
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The machine's Redis; on a machine without one, an embedded Valkey on the same port."""
    folder = tmp_path_factory.mktemp("broker")
    stack = Stack(log_dir=folder)
    try:
        yield stack.start_broker(settings.CELERY_BROKER_URL, folder)
    finally:
        stack.stop()


@pytest.fixture(scope="session", autouse=True)
def _clean_test_files() -> Iterator[None]:
    yield
    database = settings.DATABASES["default"]
    name = Path(database["NAME"])
    if database["ENGINE"].endswith("sqlite3"):
        for path in name.parent.glob(name.name + "*"):
            path.unlink(missing_ok=True)
    else:
        _test_database_drop(database)
    shutil.rmtree(settings.QDRANT_PATH, ignore_errors=True)


def _test_database_drop(database: dict[str, Any]) -> None:
    """pytest-django's own drop fails ("being accessed by other users") while threads of the
    owner and gateway fixtures still hold connections, and warns only: each run would leave
    its database on the server. Dropped here with FORCE, which ends those connections."""
    import psycopg

    with psycopg.connect(
        dbname="postgres",
        host=database["HOST"] or None,
        port=database["PORT"] or None,
        user=database["USER"] or None,
        password=database["PASSWORD"] or None,
        autocommit=True,
    ) as connection:
        test_name = psycopg.sql.Identifier(database["TEST"]["NAME"])
        connection.execute(
            psycopg.sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(test_name)
        )


@pytest.fixture
def triage_queue(db: None, user: Any) -> Any:
    return QueueFactory(
        kind="triage",
        categories=["card_arrival", "lost_or_stolen_card", "exchange_rate"],
        members=[user],
    )


@pytest.fixture
def api_token(triage_queue: Any) -> str:
    from icrlhf.ingest.services import token_create

    # Every scope: these tests are about what each endpoint does with its input.
    scopes = ["items", "gateway", "export", "feedback"]
    return token_create(queue=triage_queue, name="tests", scopes=scopes)[1]


@pytest.fixture
def gateway_threads(transactional_db: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The in-process gateway's thread pools, fresh for the test and waited for after it: a
    capture's eager chain (generation, ranking) outlives the response, and a thread still
    writing while the test's tables are truncated deadlocks the flush on PostgreSQL."""
    from icrlhf.gateway import call_log, in_flight

    pools = {
        (in_flight, "threads"): ThreadPoolExecutor(
            settings.GATEWAY_THREADS, thread_name_prefix="test-gateway"
        ),
        (call_log, "_capture_threads"): ThreadPoolExecutor(
            max_workers=2, thread_name_prefix="test-capture"
        ),
    }
    for (module, name), pool in pools.items():
        monkeypatch.setattr(module, name, pool)
    try:
        yield
    finally:
        for pool in pools.values():
            pool.shutdown(wait=True)


@pytest.fixture
def eager_tasks(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Tasks enqueued after commit run inline, in this process (with its own local store).
    The worker's other part, answering retrievals over its socket, runs inline too: a test
    double of the socket (`recall_answered_here`) hands each retrieval to the owner's own
    code in the asking thread, inside the test's transaction."""
    import celery.app.task

    from icrlhf.memory import remote_recall
    from worker import app

    monkeypatch.setattr(remote_recall, "ask", recall_answered_here)

    # While an eager task runs, Celery sets one process-wide "inside a task" flag and puts
    # back what it found after: two eager tasks on two threads (the gateway's capture pool)
    # put back each other's value and can leave it set, and every later `result.get()` in
    # the process refuses ("Never call result.get() within a task"). Inline, there is no
    # worker to deadlock: the flag is not needed.
    monkeypatch.setattr(celery.app.task, "denied_join_result", contextlib.nullcontext)
    app.conf.task_always_eager = True
    try:
        yield
    finally:
        app.conf.task_always_eager = False
