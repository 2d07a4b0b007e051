"""The fault suite's scenarios: the product's real loop under injected faults.

Runs inside the throw-away world of `manage.py chaos`, with Django set up. It owns a private
broker (a real Valkey server it can kill, which is also the cache's Redis), real Celery workers
(which it can kill -9), the real gateway process (likewise), a local OpenAI-compatible endpoint
that misbehaves on demand, and the worker's Qdrant local store. Each scenario creates items
through the services (or calls the gateway as an application does), injects one fault, waits
for recovery, then decides what is reviewable like a reviewer would, and counts what was lost
or stuck.
"""

import http.client
import json
import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings
from django.contrib.auth.models import User
from django.db.models import Max
from kombu.exceptions import OperationalError

from icrlhf.gateway.models import Call
from icrlhf.generation.models import Candidate
from icrlhf.generation.services import item_create
from icrlhf.ingest.models import Scope
from icrlhf.ingest.services import token_create
from icrlhf.memory.models import Example
from icrlhf.memory.tasks import memory_check
from icrlhf.memory.through_worker import run_in_worker
from icrlhf.ops.stack import (
    Child,
    Stack,
    celery_worker_command,
    free_port,
    gateway_command,
    http_ok,
    wait_until,
)
from icrlhf.queues.models import Item, Queue
from icrlhf.review.claims import DecisionConflict
from icrlhf.review.decisions import decision_record
from icrlhf.review.models import Decision
from icrlhf.trajectories.models import Step
from tests.support.fixed_latency_llm import FaultyLLM

RECOVERY_S = 150  # a scenario's items must settle within this, or they count as stuck
UNSETTLED_ITEMS = (Item.Status.NEW, Item.Status.GENERATING)
UNSETTLED_CANDIDATES = (Candidate.Status.PENDING, Candidate.Status.RUNNING)


@dataclass
class Outcome:
    fault: str
    runs: int = 0
    decisions_made: int = 0
    decisions_lost: int = 0
    items_stuck: int = 0
    candidates_stuck: int = 0
    examples_unindexed: int = 0
    max_attempts: int = 0
    # Gateway calls answered (a 200 with its call id), and those of them not in the call log
    # with their run's step once the scenario settled.
    calls_answered: int = 0
    calls_lost: int = 0
    notes: list[str] = field(default_factory=list)

    def add(self, other: "Outcome") -> None:
        self.runs += other.runs
        self.decisions_made += other.decisions_made
        self.decisions_lost += other.decisions_lost
        self.items_stuck += other.items_stuck
        self.candidates_stuck += other.candidates_stuck
        self.examples_unindexed += other.examples_unindexed
        self.max_attempts = max(self.max_attempts, other.max_attempts)
        self.calls_answered += other.calls_answered
        self.calls_lost += other.calls_lost
        self.notes += other.notes


class ChaosWorld:
    """The parts a scenario can break: broker, workers, gateway, LLM endpoint, vector store."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.stack = Stack(log_dir=folder / "logs")
        self.llm = FaultyLLM(latency_s=0.2)
        self.llm.start()
        self.workers: list[Child] = []
        self.worker_env: dict[str, str] = {}
        # Workers that exited on their own and were started again, as `make run`'s supervisord
        # and compose's `restart: unless-stopped` do (kombu can die on a broker that vanishes).
        self.worker_restarts: list[str] = []
        self.reviewer = User.objects.create_user(f"chaos-{uuid.uuid4().hex[:6]}")
        self.queue = Queue.objects.create(
            slug=f"chaos-{uuid.uuid4().hex[:6]}",
            name="Chaos",
            n_candidates=3,
            memory_candidates=0,
            api_base=self.llm.api_base,
        )

    # --- broker ------------------------------------------------------------------------------
    def broker_start(self) -> None:
        self.stack.start_broker(settings.CELERY_BROKER_URL, self.folder / "broker")

    def broker_restart(
        self, *, down_s: float = 0.0, during: Callable[[], None] | None = None
    ) -> None:
        """kill -9 the broker (it keeps nothing on disk: every queued message is lost)."""
        broker = next(c for c in self.stack.children if c.name == "broker")
        broker.process.kill()
        broker.process.wait()
        self.stack.children.remove(broker)
        if during:
            during()
        time.sleep(down_s)
        self.broker_start()

    # --- workers -----------------------------------------------------------------------------
    def worker_start(self, **env: str) -> None:
        self.worker_env = env
        name = f"chaos-{uuid.uuid4().hex[:6]}@localhost"
        child = self.stack.spawn(
            "worker",
            celery_worker_command(
                "--concurrency",
                "6",
                "--hostname",
                name,
                "--without-mingle",
                "--without-gossip",
                "--beat",
                "--schedule",
                str(self.folder / f"beat-{name}"),
            ),
            env=env,
        )
        self.workers.append(child)
        from worker import app

        connection_errors = (*app.connection_for_read().connection_errors, OperationalError)

        def ready() -> bool:
            if child.process.poll() is not None:
                raise RuntimeError(f"The worker exited; see {child.log}")
            try:
                return bool(app.control.ping(destination=[name], timeout=0.5))
            except connection_errors:
                # This process's pooled connection may still point at a broker that was
                # restarted (the scenario before): its next use reconnects. Ask again.
                return False

        wait_until(ready, timeout_s=90, what="The Celery worker")

    def workers_revive(self) -> None:
        """Starts a worker again when one exited on its own, like the supervisor would."""
        dead = [child for child in self.workers if child.process.poll() is not None]
        if not dead:
            return
        self.worker_restarts += [f"worker exited with {c.process.returncode}" for c in dead]
        self.workers = [child for child in self.workers if child not in dead]
        self.worker_start(**self.worker_env)

    def worker_kill(self) -> None:
        """kill -9 the worker and its beat: no shutdown, no acknowledgement, no cleanup."""
        for child in self.workers:
            if child.process.poll() is None:
                os.killpg(child.process.pid, signal.SIGKILL)
                child.process.wait()
        self.workers.clear()

    def worker_stop(self) -> None:
        for child in self.workers:
            child.process.terminate()
            try:
                child.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(child.process.pid, signal.SIGKILL)
        self.workers.clear()

    # --- gateway ----------------------------------------------------------------------------
    def gateway_start(self) -> tuple[Child, str]:
        """The real gateway (uvicorn, one process) on the world's database, broker and cache's
        Redis (so its call-log journal is the workers' too), calling the world's LLM endpoint;
        returns it and its API base once it answers."""
        port = free_port()
        child = self.stack.spawn(
            "gateway",
            gateway_command(port, workers=1),
            # The gateway writes its own log: the faults below kill it, writer and all.
            env={
                **self.worker_env,
                "LLM_API_BASE": self.llm.api_base,
                "CALL_LOG_WRITER": "gateway",
            },
        )
        base = f"http://127.0.0.1:{port}"

        def ready() -> bool:
            if child.process.poll() is not None:
                raise RuntimeError(f"The gateway exited; see {child.log}")
            return http_ok(f"{base}/healthz")

        wait_until(ready, timeout_s=60, what="The gateway")
        return child, f"{base}/v1"

    def gateway_kill(self, gateway: Child) -> None:
        """kill -9 the gateway: its writer neither drains the journal nor lets its lock go."""
        if gateway.process.poll() is None:
            os.killpg(gateway.process.pid, signal.SIGKILL)
        gateway.process.wait()
        self.stack.children.remove(gateway)

    def stop(self) -> None:
        self.worker_kill()
        self.stack.stop()
        self.llm.stop()

    def _worker_log_tail(self, lines: int = 15) -> list[str]:
        logs = sorted(self.stack.log_dir.glob("worker*.log"))
        if not logs:
            return []
        return logs[-1].read_text(errors="replace").splitlines()[-lines:]

    # --- the product's loop ----------------------------------------------------------------
    def items_create(self, count: int) -> list[int]:
        return [
            item_create(
                queue=self.queue, input_text=f"Chaos request {uuid.uuid4().hex}", created_by=None
            ).pk
            for _ in range(count)
        ]

    def settle(self, item_ids: list[int], timeout_s: float = RECOVERY_S) -> None:
        """Waits until no item is generating and no candidate pending or running."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and (
            self._items_stuck(item_ids) or self._candidates_stuck(item_ids)
        ):
            self.workers_revive()
            time.sleep(0.5)

    @staticmethod
    def _items_stuck(item_ids: list[int]) -> int:
        return Item.objects.filter(pk__in=item_ids, status__in=UNSETTLED_ITEMS).count()

    @staticmethod
    def _candidates_stuck(item_ids: list[int]) -> int:
        return Candidate.objects.filter(
            generation__item_id__in=item_ids, status__in=UNSETTLED_CANDIDATES
        ).count()

    def decide(self, item_id: int) -> int | None:
        """Decides like a reviewer: picks the first answer; None when it is not reviewable."""
        candidate = (
            Candidate.objects.filter(generation__item_id=item_id, status=Candidate.Status.DONE)
            .order_by("-generation__created_at", "position")
            .first()
        )
        if candidate is None:
            return None
        try:
            decision = decision_record(
                item_id=item_id, reviewer=self.reviewer, verdict="chosen", candidate_id=candidate.pk
            )
        except DecisionConflict:
            return None
        return decision.pk

    def examples_settle(self, decision_ids: list[int], timeout_s: float = RECOVERY_S) -> int:
        """Waits until the decisions' examples are indexed; returns how many are not."""
        examples = Example.objects.filter(decision_id__in=decision_ids).exclude(
            index_state=Example.IndexState.INDEXED
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and examples.exists():
            self.workers_revive()
            time.sleep(0.5)
        return examples.count()

    def outcome(self, fault: str, item_ids: list[int], decision_ids: list[int]) -> Outcome:
        """What became of a scenario's items and decisions, once their examples settled."""
        saved = Decision.objects.filter(pk__in=decision_ids).count()
        attempts = Candidate.objects.filter(generation__item_id__in=item_ids).aggregate(
            most=Max("attempts")
        )["most"]
        unindexed = self.examples_settle(decision_ids)
        notes = [f"{note}; started again, as its supervisor would" for note in self.worker_restarts]
        self.worker_restarts = []
        if unindexed:  # say where they stopped, so a rare failure can be told apart
            states = Example.objects.filter(decision_id__in=decision_ids).values_list(
                "index_state", flat=True
            )
            notes.append(f"example index states: {sorted(Counter(states).items())}")
            notes += [f"worker log: {line}" for line in self._worker_log_tail()]
        return Outcome(
            notes=notes,
            fault=fault,
            runs=1,
            decisions_made=len(decision_ids),
            decisions_lost=len(decision_ids) - saved,
            examples_unindexed=unindexed,
            items_stuck=self._items_stuck(item_ids),
            candidates_stuck=self._candidates_stuck(item_ids),
            max_attempts=attempts or 0,
        )


def _wait_running(item_ids: list[int], at_least: int) -> None:
    wait_until(
        lambda: (
            Candidate.objects.filter(
                generation__item_id__in=item_ids, status=Candidate.Status.RUNNING
            ).count()
            >= at_least
        ),
        timeout_s=60,
        what="Running candidates",
    )


def _decide_all(world: ChaosWorld, item_ids: list[int]) -> list[int]:
    return [pk for pk in (world.decide(item_id) for item_id in item_ids) if pk is not None]


def worker_killed(world: ChaosWorld) -> Outcome:
    """kill -9 the worker while candidates generate; a new worker and the sweeper finish them."""
    world.llm.latency_s = 1.0
    items = world.items_create(8)
    _wait_running(items, at_least=3)
    world.worker_kill()
    world.worker_start()
    world.settle(items)
    world.llm.latency_s = 0.2
    return world.outcome("worker killed (kill -9) mid-generation", items, _decide_all(world, items))


def broker_restart_generating(world: ChaosWorld) -> Outcome:
    """The broker dies while candidates generate, losing every queued message."""
    world.llm.latency_s = 0.5
    items = world.items_create(10)
    _wait_running(items, at_least=2)
    world.broker_restart(down_s=1.0)
    world.settle(items)
    world.llm.latency_s = 0.2
    return world.outcome("broker restarted mid-generation", items, _decide_all(world, items))


def broker_restart_deciding(world: ChaosWorld) -> Outcome:
    """The broker dies during a burst of decisions: they are saved, their examples indexed."""
    items = world.items_create(24)
    world.settle(items)
    decisions = _decide_all(world, items[:8])
    world.broker_restart(
        down_s=0.5, during=lambda: decisions.extend(_decide_all(world, items[8:16]))
    )
    decisions += _decide_all(world, items[16:])
    return world.outcome("broker restarted mid-decision burst", items, decisions)


def vector_store_down(world: ChaosWorld) -> Outcome:
    """The vector store is unreachable while items generate and are decided; once it is back,
    the examples are indexed and the store matches the database."""
    world.worker_stop()
    unreachable = f"http://127.0.0.1:{free_port()}"
    world.worker_start(QDRANT_URL=unreachable)
    items = world.items_create(6)
    world.settle(items)
    decisions = _decide_all(world, items)
    world.worker_stop()
    world.worker_start()
    outcome = world.outcome("vector store unavailable", items, decisions)
    report = run_in_worker(memory_check, timeout_s=60, queue_slug=world.queue.slug)
    if report["drift"]:
        outcome.notes.append(f"memory_check found drift: {report['queues']}")
        outcome.examples_unindexed = max(outcome.examples_unindexed, 1)
    return outcome


def _llm_fault(
    world: ChaosWorld, label: str, *, fault: str = "", failures: int = -1, latency_s: float = 0.2
) -> Outcome:
    """Items generated while the endpoint misbehaves; every failed candidate must say why."""
    world.llm.fault, world.llm.failures_left, world.llm.latency_s = fault, failures, latency_s
    try:
        items = world.items_create(4)
        world.settle(items)
    finally:
        world.llm.fault, world.llm.failures_left, world.llm.latency_s = "", -1, 0.2
    outcome = world.outcome(label, items, _decide_all(world, items))
    unexplained = Candidate.objects.filter(
        generation__item_id__in=items, status=Candidate.Status.FAILED, error=""
    ).count()
    if unexplained:
        outcome.notes.append(f"{unexplained} failed candidates without a message")
        outcome.candidates_stuck += unexplained
    return outcome


def llm_slow(world: ChaosWorld) -> Outcome:
    return _llm_fault(world, "LLM slower than its timeout", latency_s=settings.LLM_TIMEOUT_S + 1)


def llm_rate_limited(world: ChaosWorld) -> Outcome:
    return _llm_fault(world, "LLM answers 429 (always)", fault="rate_limit")


def llm_server_errors(world: ChaosWorld) -> Outcome:
    return _llm_fault(world, "LLM answers 500 (always)", fault="server_error")


def llm_garbage(world: ChaosWorld) -> Outcome:
    return _llm_fault(world, "LLM answers garbage", fault="garbage")


def llm_flaky(world: ChaosWorld) -> Outcome:
    return _llm_fault(world, "LLM answers 429, then recovers", fault="rate_limit", failures=6)


GATEWAY_CLIENTS, GATEWAY_CALLS_EACH = 16, 4
GATEWAY_KILL_AFTER = 12  # answers


def _calls_burst(
    api_base: str, token: str, model: str, *, kill: Callable[[], None]
) -> tuple[list[str], int]:
    """Calls the gateway from GATEWAY_CLIENTS clients at once and runs `kill` once
    GATEWAY_KILL_AFTER calls were answered; returns the ids of the calls answered (each 200's
    X-Icrlhf-Call, read to its end) and how many calls were not."""
    answered: list[str] = []
    failed: list[int] = []
    enough = threading.Event()

    def call(n: int) -> None:
        body = {"model": model, "messages": [{"role": "user", "content": f"Chaos question {n}"}]}
        request = urllib.request.Request(
            f"{api_base}/chat/completions",
            data=json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 (loopback)
                response.read()
                answered.append(response.headers["X-Icrlhf-Call"])
        except (urllib.error.URLError, http.client.HTTPException, OSError):
            failed.append(n)  # refused, or cut off by the kill: never answered, nothing owed
            return
        if len(answered) >= GATEWAY_KILL_AFTER:
            enough.set()

    with ThreadPoolExecutor(GATEWAY_CLIENTS) as clients:
        for n in range(GATEWAY_CLIENTS * GATEWAY_CALLS_EACH):
            clients.submit(call, n)
        enough.wait(timeout=60)
        kill()
    return answered, len(failed)


def gateway_killed(world: ChaosWorld) -> Outcome:
    """kill -9 the gateway in the middle of a burst of calls. It answers before it logs (the
    row goes to the journal in Redis, its writer thread writes it): the rows it had not written
    are written by the worker's periodic sweep once the dead writer's lock has expired. Every
    call answered must then be in the log with its run's step; a row cannot be there twice
    (the call's id is its key, and its step's)."""
    world.llm.latency_s = 0.2
    queue = Queue.objects.create(
        slug=f"chaos-gw-{uuid.uuid4().hex[:6]}", name="Chaos gateway", api_base=world.llm.api_base
    )
    token = token_create(queue=queue, name="chaos", scopes=[Scope.GATEWAY.value])[1]
    gateway, api_base = world.gateway_start()
    answered, failed = _calls_burst(
        api_base, token, queue.slug, kill=lambda: world.gateway_kill(gateway)
    )
    logged_at_kill = Step.objects.filter(call_id__in=answered).count()
    killed = time.monotonic()

    def unlogged() -> int:
        return len(set(answered)) - Step.objects.filter(call_id__in=answered).count()

    deadline = killed + RECOVERY_S
    while unlogged() and time.monotonic() < deadline:
        world.workers_revive()
        time.sleep(0.5)
    lost = unlogged() + len(answered) - len(set(answered))  # an id answered twice: one lost
    notes = [
        f"{len(answered)} calls answered, {failed} cut off by the kill or refused; "
        f"{logged_at_kill} in the call log with their step at the kill, "
        f"{len(answered) - lost} {time.monotonic() - killed:.1f} s later"
    ]
    if len(answered) < GATEWAY_KILL_AFTER or not failed:
        notes.append("the gateway was not killed mid-burst: the scenario proved less")
        notes += [f"gateway log: {line}" for line in _log_tail(gateway.log)]
    if lost:
        notes.append(f"{Call.objects.filter(pk__in=answered).count()} answered calls have a row")
        notes += [f"worker log: {line}" for line in world._worker_log_tail()]
    notes += [f"{note}; started again, as its supervisor would" for note in world.worker_restarts]
    world.worker_restarts = []
    return Outcome(
        fault="gateway killed (kill -9) mid-burst",
        runs=1,
        calls_answered=len(answered),
        calls_lost=lost,
        notes=notes,
    )


def _log_tail(log: Path, lines: int = 15) -> list[str]:
    return log.read_text(errors="replace").splitlines()[-lines:] if log.exists() else []


SCENARIOS: dict[str, Callable[[ChaosWorld], Outcome]] = {
    "worker_killed": worker_killed,
    "gateway_killed": gateway_killed,
    "broker_restart_generating": broker_restart_generating,
    "broker_restart_deciding": broker_restart_deciding,
    "vector_store_down": vector_store_down,
    "llm_slow": llm_slow,
    "llm_rate_limited": llm_rate_limited,
    "llm_server_errors": llm_server_errors,
    "llm_garbage": llm_garbage,
    "llm_flaky": llm_flaky,
}


def run(folder: Path, names: list[str], runs: int) -> list[Outcome]:
    world = ChaosWorld(folder)
    try:
        world.broker_start()
        world.worker_start()
        outcomes = []
        for name in names:
            total = Outcome(fault="")
            for _ in range(runs):
                result = SCENARIOS[name](world)
                total.fault = result.fault
                total.add(result)
            outcomes.append(total)
        return outcomes
    finally:
        world.stop()
