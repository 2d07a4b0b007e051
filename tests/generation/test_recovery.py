"""The generation sweeper: finds work a dead worker or a lost broker message left behind."""

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from icrlhf.generation import pipeline, recovery
from icrlhf.generation.models import Candidate, Generation
from icrlhf.generation.services import item_create
from icrlhf.queues.models import Item
from tests.support.llm_answer import LLMAnswer

pytestmark = pytest.mark.django_db

LONG_AGO = timedelta(minutes=10)


@pytest.fixture
def running(queue: Any, user: Any, vector_store: Path) -> Generation:
    """A prepared generation whose candidates are all pending (their tasks not yet run)."""
    item = item_create(queue=queue, input_text="Where is my card?", created_by=user)
    pipeline.generation_prepare(generation_id=item.generations.get().pk)
    return Generation.objects.get(item=item)


def test_a_running_candidate_whose_lease_expired_is_generated_again(
    llm_answer: LLMAnswer, running: Generation
) -> None:
    dead, alive, *_ = running.candidates.order_by("pk")
    now = timezone.now()
    Candidate.objects.filter(pk=dead.pk).update(
        status="running", attempts=1, lease_expires_at=now - timedelta(seconds=1)
    )
    Candidate.objects.filter(pk=alive.pk).update(
        status="running", attempts=1, lease_expires_at=now + timedelta(minutes=1)
    )
    sweep = recovery.generations_sweep(broker_backlog=100)
    assert sweep.generate == [dead.pk] and sweep.prepare == []
    llm_answer("Recovered.")
    pipeline.candidate_generate(candidate_id=dead.pk)
    dead.refresh_from_db()
    assert (dead.status, dead.text, dead.attempts) == ("done", "Recovered.", 2)


def test_a_candidate_that_kept_killing_its_worker_fails_and_the_item_settles(
    llm_answer: LLMAnswer, running: Generation, settings: Any
) -> None:
    Candidate.objects.filter(generation=running).update(
        status="running",
        attempts=settings.LLM_MAX_RETRIES + 1,
        lease_expires_at=timezone.now() - timedelta(seconds=1),
    )
    sweep = recovery.generations_sweep(broker_backlog=0)
    assert len(sweep.generate) == running.n_candidates
    for candidate_id in sweep.generate:
        llm_answer("never called")
        pipeline.candidate_generate(candidate_id=candidate_id)
    failed = list(running.candidates.all())
    assert {c.status for c in failed} == {"failed"}
    assert {c.attempts for c in failed} == {settings.LLM_MAX_RETRIES + 1}  # no extra call
    assert failed[0].error == (
        f"Gave up after {settings.LLM_MAX_RETRIES + 1} attempts. "
        "Its worker stopped while generating."
    )
    assert Item.objects.get(pk=running.item_id).status == Item.Status.FAILED


def test_a_candidate_enqueued_again_after_its_retries_never_calls_the_model_again(
    llm_answer: LLMAnswer, running: Generation, settings: Any
) -> None:
    candidate = running.candidates.first()
    assert candidate is not None
    Candidate.objects.filter(pk=candidate.pk).update(
        attempts=settings.LLM_MAX_RETRIES + 1, error="Retrying: The model is rate-limited."
    )
    llm_answer("never called")
    pipeline.candidate_generate(candidate_id=candidate.pk)
    candidate.refresh_from_db()
    assert (candidate.status, candidate.text) == ("failed", "")
    assert candidate.error.endswith("attempts. The model is rate-limited.")


def test_pending_work_is_sent_again_only_when_the_broker_holds_fewer_messages(
    running: Generation, queue: Any, user: Any
) -> None:
    lost = item_create(queue=queue, input_text="Lost prepare", created_by=user).generations.get()
    Generation.objects.filter(pk=lost.pk).update(created_at=timezone.now() - LONG_AGO)
    Generation.objects.filter(pk=running.pk).update(prepared_at=timezone.now() - LONG_AGO)
    # Two messages: the prepare, and the one that fans out all the candidates of `running`.
    busy = recovery.generations_sweep(broker_backlog=2)
    assert busy.prepare == [] and busy.generate == []  # their messages may all be queued
    # Fewer messages than that (say, one periodic task passing through): some are lost.
    for backlog in (0, 1):
        sweep = recovery.generations_sweep(broker_backlog=backlog)
        assert sweep.prepare == [lost.pk]
        assert sweep.generate == sorted(running.candidates.values_list("pk", flat=True))
    # A candidate waiting for its retry has a message of its own.
    retried = running.candidates.first()
    assert retried is not None
    Candidate.objects.filter(pk=retried.pk).update(started_at=timezone.now() - LONG_AGO)
    assert recovery.generations_sweep(broker_backlog=3).generate == []
    assert len(recovery.generations_sweep(broker_backlog=2).generate) == running.n_candidates


def test_recent_pending_work_is_left_to_its_tasks(running: Generation, queue: Any) -> None:
    sweep = recovery.generations_sweep(broker_backlog=0)
    assert sweep == recovery.Sweep(prepare=[], generate=[], rank=[])


def test_a_finished_generation_whose_ranking_was_lost_is_ranked_again(
    running: Generation, queue: Any
) -> None:
    now = timezone.now()
    Generation.objects.filter(pk=running.pk).update(
        status=Generation.Status.DONE, finished_at=now - LONG_AGO
    )
    assert recovery.generations_sweep(broker_backlog=0).rank == [running.pk]
    assert recovery.generations_sweep(broker_backlog=1).rank == []  # its message may be queued
    # One finished before ranking existed (over a day ago) is left as it was.
    Generation.objects.filter(pk=running.pk).update(finished_at=now - timedelta(days=2))
    assert recovery.generations_sweep(broker_backlog=0).rank == []
    Generation.objects.filter(pk=running.pk).update(finished_at=now - LONG_AGO, ranked_at=now)
    assert recovery.generations_sweep(broker_backlog=0).rank == []
