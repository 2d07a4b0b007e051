"""Generation services in-process: litellm runs its real code path, answering through its own
`mock_response` (the `llm_answer` fixture) or over HTTP from a local endpoint; the vector store
is a real local folder."""

import contextlib
import json
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import LazySettings
from django.db import connection
from django.test.utils import CaptureQueriesContext

from icrlhf.generation import pipeline, tasks
from icrlhf.generation.models import Candidate, Generation
from icrlhf.generation.services import item_create
from icrlhf.integrations import llm
from icrlhf.queues.models import Item
from tests.factories import QueueFactory, playbook_write, stored_example
from tests.support.fixed_latency_llm import FixedLatencyLLM
from tests.support.llm_answer import LLMAnswer

pytestmark = pytest.mark.django_db


@pytest.fixture
def generation(queue: Any, user: Any, vector_store: Path) -> Generation:
    item = item_create(queue=queue, input_text="Where is my card?", created_by=user)
    pipeline.generation_prepare(generation_id=item.generations.get().pk)
    return Generation.objects.get(item=item)


def test_prepare_stores_the_exact_messages_and_fans_out(
    queue: Any, user: Any, vector_store: Path, django_capture_on_commit_callbacks: Any
) -> None:
    playbook_write(queue, [("Tone", "Be brief.")])
    item = item_create(queue=queue, input_text="Where is my card?", created_by=user)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        enqueued = pipeline.generation_prepare(generation_id=item.generations.get().pk)
    generation = item.generations.get()
    assert generation.status == Generation.Status.RUNNING
    assert generation.messages[0]["role"] == "system"
    assert (
        "(version 1), rules your answer follows:\nTone:\n- Be brief."
        in (generation.messages[0]["content"])
    )
    assert generation.playbook is not None and generation.playbook.number == 1
    assert generation.messages[-1] == {"role": "user", "content": "Where is my card?"}
    assert sorted(enqueued) == sorted(generation.candidates.values_list("pk", flat=True))
    assert len(callbacks) == 1
    # A redelivered prepare task finds the generation taken and does nothing.
    assert pipeline.generation_prepare(generation_id=generation.pk) == []


def test_prepare_asks_once_what_memory_holds_and_records_it(
    queue: Any, user: Any, vector_store: Path
) -> None:
    stored_example(queue, input_text="Where is my parcel?", output_text="It ships tomorrow.")
    item = item_create(queue=queue, input_text="Where is my card?", created_by=user)
    with CaptureQueriesContext(connection) as prepared:
        pipeline.generation_prepare(generation_id=item.generations.get().pk)
    # Whether memory holds anything and how much: one count, not an EXISTS and then a count.
    asked = [
        query["sql"]
        for query in prepared.captured_queries
        if query["sql"].startswith(
            (
                'SELECT COUNT(*) AS "__count" FROM "memory_example"',
                'SELECT 1 AS "a" FROM "memory_example"',
            )
        )
    ]
    assert len(asked) == 1
    generation = item.generations.get()
    assert generation.stored_examples == 1 and generation.retrieval_ms is not None


def test_a_generation_makes_the_same_few_statements_from_item_to_finish(
    llm_answer: LLMAnswer, queue: Any, user: Any, vector_store: Path
) -> None:
    """PostgreSQL pays a round trip per statement (~0.4 ms more than SQLite's on a 2-core
    machine, docs/benchmarks.md: the pipeline), so their number is the pipeline's budget
    there, pinned: a new statement on this path has to be meant."""
    llm_answer("The card ships tomorrow.")
    with CaptureQueriesContext(connection) as made:
        item = item_create(queue=queue, input_text="Where is my card?", created_by=user)
        # As a worker that consumes both queues runs it: the candidates generated inline.
        pipeline.generation_prepare(generation_id=item.generations.get().pk, inline=True)
    item.refresh_from_db()
    assert item.status == Item.Status.READY
    # Item creation 6 (the item, the generation, its candidates and the fair priority, in a
    # transaction: a savepoint here); the test's own read of the generation 1; prepare 10
    # (the claim and its read, memory's count, the earlier rounds, the playbook in force, a
    # transaction around the generation's update and the candidates' read and claim); the
    # answers 1; the finish 6
    # (the count, a transaction around the generation's and the item's updates and the
    # ranking's priority).
    assert len(made.captured_queries) == 24, "\n".join(
        query["sql"][:80] for query in made.captured_queries
    )


def test_a_candidate_is_saved_with_its_answer_and_usage(
    llm_answer: LLMAnswer, generation: Generation
) -> None:
    first, *others = generation.candidates.all()
    llm_answer("The card ships tomorrow.")
    pipeline.candidate_generate(candidate_id=first.pk)
    first.refresh_from_db()
    assert first.status == Candidate.Status.DONE
    assert first.text == "The card ships tomorrow."
    assert first.attempts == 1 and first.latency_ms is not None
    generation.refresh_from_db()
    assert generation.status == Generation.Status.RUNNING  # others still pending

    for candidate in others:
        llm_answer("Another answer.")
        pipeline.candidate_generate(candidate_id=candidate.pk)
    generation.refresh_from_db()
    assert generation.status == Generation.Status.DONE and generation.finished_at
    assert Item.objects.get(pk=generation.item_id).status == Item.Status.READY


def test_answers_that_arrive_together_are_saved_by_one_statement_and_errors_with_them(
    generation: Generation, django_assert_num_queries: Any
) -> None:
    """One statement for the answers, no savepoint or transaction around it (on PostgreSQL
    each would be a round trip); an error among them is saved in one transaction with them."""
    candidates = pipeline._candidates_claim(
        list(generation.candidates.values_list("pk", flat=True))
    )
    answer = llm.Completion(
        text="Answer.", model="m", prompt_tokens=1, completion_tokens=1, cost_usd=0.0, latency_ms=5
    )
    queue = generation.item.queue
    with django_assert_num_queries(1):
        pipeline._candidates_save(
            [(candidate, answer) for candidate in candidates[:-2]], queue=queue
        )
    error = llm.PermanentLLMError("The model rejected the request.")
    with django_assert_num_queries(4):  # savepoint, the error, the answer, release
        pipeline._candidates_save([(candidates[-2], answer), (candidates[-1], error)], queue=queue)
    statuses = list(generation.candidates.order_by("pk").values_list("status", flat=True))
    assert statuses == [Candidate.Status.DONE] * (len(candidates) - 1) + [Candidate.Status.FAILED]


def test_a_claimed_candidate_is_not_generated_twice(
    llm_answer: LLMAnswer, generation: Generation
) -> None:
    candidate = generation.candidates.first()
    assert candidate is not None
    llm_answer("once")
    pipeline.candidate_generate(candidate_id=candidate.pk)
    llm_answer("twice")
    pipeline.candidate_generate(candidate_id=candidate.pk)
    candidate.refresh_from_db()
    assert candidate.text == "once" and candidate.attempts == 1


def test_a_transient_error_releases_the_candidate_and_schedules_its_retry(
    llm_answer: LLMAnswer, generation: Generation, django_capture_on_commit_callbacks: Any
) -> None:
    candidate = generation.candidates.first()
    assert candidate is not None
    llm_answer("litellm.RateLimitError")
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        pipeline.candidate_generate(candidate_id=candidate.pk)
    assert len(callbacks) == 1  # its retry, alone
    candidate.refresh_from_db()
    assert candidate.status == Candidate.Status.PENDING
    assert candidate.error.startswith("Retrying: The model is rate-limited")
    llm_answer("second try")
    pipeline.candidate_generate(candidate_id=candidate.pk)
    candidate.refresh_from_db()
    assert (candidate.status, candidate.text, candidate.attempts) == ("done", "second try", 2)


@pytest.mark.usefixtures("eager_tasks")
def test_an_unreachable_model_is_retried_then_marked_failed(
    generation: Generation, settings: LazySettings, django_capture_on_commit_callbacks: Any
) -> None:
    settings.LLM_API_BASE = "http://127.0.0.1:9/v1"  # nothing listens there
    candidate = generation.candidates.first()
    assert candidate is not None
    # Each retry is sent after its attempt commits; eager, it runs at once.
    with django_capture_on_commit_callbacks(execute=True):
        tasks.candidate_generate.apply(args=[candidate.pk])
    candidate.refresh_from_db()
    assert candidate.status == Candidate.Status.FAILED
    assert candidate.attempts == settings.LLM_MAX_RETRIES + 1
    assert candidate.error.startswith(f"Gave up after {settings.LLM_MAX_RETRIES + 1} attempts.")
    assert "could not be reached" in candidate.error


class InFlightLLM(FixedLatencyLLM):
    """Counts the calls it is answering at the same moment. A call for one answer is held
    until `together` calls have been in hand at once: calls sent at once all meet there and
    are counted together, however slowly their threads start, while a call sent alone (or
    one after another) waits out HOLD_BOUND_S and is counted alone."""

    HOLD_BOUND_S = 10

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.together = 1
        self.in_flight = self.most_in_flight = 0
        self._counting = threading.Condition()

    def respond(self, request: dict[str, Any]) -> tuple[int, bytes]:
        with self._counting:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            self._counting.notify_all()
            if (request.get("n") or 1) == 1:
                # On the peak, not the count now: the first call let go may be answered and
                # gone before the others wake up to look.
                self._counting.wait_for(
                    lambda: self.most_in_flight >= self.together, timeout=self.HOLD_BOUND_S
                )
        try:
            return self.reply(request)
        finally:
            with self._counting:
                self.in_flight -= 1

    def reply(self, request: dict[str, Any]) -> tuple[int, bytes]:
        return super().respond(request)


class OneAnswerLLM(InFlightLLM):
    """A server that ignores `n` and answers once (llama-cpp-python's does)."""

    def reply(self, request: dict[str, Any]) -> tuple[int, bytes]:
        return super().reply({**request, "n": 1})


class RefusesManyLLM(InFlightLLM):
    """A server that refuses `n` above 1 (llama.cpp's, beyond its parallel slots)."""

    refused = 0

    def reply(self, request: dict[str, Any]) -> tuple[int, bytes]:
        if (request.get("n") or 1) > 1:
            self.refused += 1
            return 400, json.dumps({"error": {"message": "n is too large"}}).encode()
        return super().reply(request)


@contextlib.contextmanager
def serving[S: InFlightLLM](server: S, settings: LazySettings) -> Iterator[S]:
    """The server answers this test's calls, under a model name of its own: what an endpoint
    did (answered `n` with one answer) is remembered by name, and ports are reused."""
    server.start()
    settings.LLM_API_BASE = server.api_base
    settings.LLM_MODEL = f"openai/test-{uuid.uuid4().hex[:8]}"
    try:
        yield server
    finally:
        server.stop()


def _generate_all(queue: Any, user: Any, n: int) -> Generation:
    item = item_create(queue=queue, input_text="Where is my card?", created_by=user, n_candidates=n)
    generation = item.generations.get()
    pipeline.generation_prepare(generation_id=generation.pk)
    pipeline.candidates_generate(
        candidate_ids=list(generation.candidates.values_list("pk", flat=True))
    )
    return generation


def _all_done_and_distinct(generation: Generation, n: int) -> bool:
    candidates = list(generation.candidates.all())
    return (
        len(candidates) == n
        and {c.status for c in candidates} == {Candidate.Status.DONE}
        and len({c.text for c in candidates}) == n
        and all(c.attempts == 1 for c in candidates)
        and Item.objects.get(pk=generation.item_id).status == Item.Status.READY
    )


@pytest.mark.usefixtures("vector_store")
def test_a_generation_asks_for_all_its_answers_in_one_call(
    queue: Any, user: Any, settings: LazySettings
) -> None:
    with serving(InFlightLLM(latency_s=0), settings) as server:
        generation = _generate_all(queue, user, n=4)
    assert server.calls == 1 and server.last_request["n"] == 4
    assert _all_done_and_distinct(generation, 4)
    done = generation.candidates.first()
    assert done is not None and done.completion_tokens == llm.count_tokens(done.text)


@pytest.mark.usefixtures("vector_store")
def test_a_server_that_answers_once_is_asked_for_the_rest_at_once_then_always_one_by_one(
    queue: Any, user: Any, settings: LazySettings
) -> None:
    with serving(OneAnswerLLM(latency_s=0), settings) as server:
        server.together = 3  # the rest of the first generation's answers
        first = _generate_all(queue, user, n=4)
        assert server.calls == 1 + 3 and server.most_in_flight == 3
        server.together = 4  # all of the second's
        second = _generate_all(queue, user, n=4)
    assert server.calls == 4 + 4 and server.most_in_flight == 4
    assert _all_done_and_distinct(first, 4) and _all_done_and_distinct(second, 4)


@pytest.mark.usefixtures("vector_store")
def test_a_server_that_refuses_several_answers_is_asked_once_per_candidate_at_once(
    queue: Any, user: Any, settings: LazySettings
) -> None:
    with serving(RefusesManyLLM(latency_s=0), settings) as server:
        server.together = 3  # one call per candidate, after the refused call for all three
        generation = _generate_all(queue, user, n=3)
    assert (server.refused, server.calls, server.most_in_flight) == (1, 3, 3)
    assert _all_done_and_distinct(generation, 3)


class GarbageLLM(FixedLatencyLLM):
    def respond(self, request: dict[str, Any]) -> tuple[int, bytes]:
        return 200, b"<html>certainly not JSON</html>"


class EmptyAnswerLLM(FixedLatencyLLM):
    def respond(self, request: dict[str, Any]) -> tuple[int, bytes]:
        answer = self.answer(request)
        for choice in answer["choices"]:
            choice["message"]["content"] = "   "
        return 200, json.dumps(answer).encode()


class BadRequestLLM(FixedLatencyLLM):
    def respond(self, request: dict[str, Any]) -> tuple[int, bytes]:
        return 400, json.dumps({"error": {"message": "max_tokens is too large"}}).encode()


@pytest.mark.parametrize(
    ("server_class", "message"),
    [
        (GarbageLLM, "The model's answer could not be read: not JSON."),
        (EmptyAnswerLLM, "The model returned an empty answer."),
        (BadRequestLLM, "The model rejected the request"),
    ],
)
def test_a_garbage_or_refused_answer_fails_the_candidate_readably(
    generation: Generation,
    settings: LazySettings,
    server_class: type[FixedLatencyLLM],
    message: str,
) -> None:
    server = server_class(latency_s=0).start()
    settings.LLM_API_BASE = server.api_base
    try:
        for candidate in generation.candidates.all():
            tasks.candidate_generate.apply(args=[candidate.pk])
    finally:
        server.stop()
    candidates = list(generation.candidates.all())
    assert {c.status for c in candidates} == {Candidate.Status.FAILED}
    assert all(c.error.startswith(message) for c in candidates)
    assert all("Traceback" not in c.error for c in candidates)
    generation.refresh_from_db()
    assert generation.status == Generation.Status.FAILED
    assert Item.objects.get(pk=generation.item_id).status == Item.Status.FAILED


def test_a_timeout_is_transient(generation: Generation, settings: LazySettings) -> None:
    server = FixedLatencyLLM(latency_s=2).start()
    settings.LLM_API_BASE = server.api_base
    settings.LLM_TIMEOUT_S = 0.3
    candidate = generation.candidates.first()
    assert candidate is not None
    try:
        pipeline.candidate_generate(candidate_id=candidate.pk)
    finally:
        server.stop()
    candidate.refresh_from_db()
    assert candidate.status == Candidate.Status.PENDING
    assert candidate.error.startswith("Retrying: The model did not answer in time")


def test_some_failures_still_leave_the_item_reviewable(
    llm_answer: LLMAnswer, generation: Generation
) -> None:
    first, *others = generation.candidates.all()
    llm_answer("good")
    pipeline.candidate_generate(candidate_id=first.pk)
    for candidate in others:
        pipeline.candidate_fail(candidate_id=candidate.pk, message="boom")
    generation.refresh_from_db()
    assert generation.status == Generation.Status.DONE
    assert Item.objects.get(pk=generation.item_id).status == Item.Status.READY


def test_a_worker_on_both_queues_generates_the_candidates_in_its_prepare_task(
    queue: Any,
    user: Any,
    vector_store: Path,
    llm_answer: LLMAnswer,
    monkeypatch: pytest.MonkeyPatch,
    django_capture_on_commit_callbacks: Any,
) -> None:
    llm_answer("The card ships tomorrow.")
    monkeypatch.setattr(tasks, "fan_out_inline", True)
    item = item_create(queue=queue, input_text="Where is my card?", created_by=user)
    generation = item.generations.get()
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        assert tasks.generation_prepare.apply(args=[generation.pk]).successful()
    # No message for the candidates: they were generated here. The one left is the ranking.
    assert [c.__qualname__ for c in callbacks] == [
        "generation_finish_if_complete.<locals>.<lambda>"
    ]
    assert {c.text for c in generation.candidates.all()} == {"The card ships tomorrow."}
    assert {(c.status, c.attempts) for c in generation.candidates.all()} == {
        (Candidate.Status.DONE, 1)
    }
    assert Item.objects.get(pk=item.pk).status == Item.Status.READY


def test_a_prepare_whose_candidates_were_taken_leaves_them_to_the_sweep(
    queue: Any, user: Any
) -> None:
    item = item_create(queue=queue, input_text="Where is my card?", created_by=user)
    candidates = list(item.generations.get().candidates.order_by("pk"))
    # Another prepare, after this one's lease ran out, claimed one of them.
    Candidate.objects.filter(pk=candidates[0].pk).update(status=Candidate.Status.RUNNING)
    assert pipeline._candidates_claim_prepared(candidates) == []
    assert all(c.status == Candidate.Status.PENDING for c in candidates)  # not run here


def test_candidates_generated_in_the_prepare_task_are_failed_if_it_fails(
    queue: Any, user: Any, vector_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*_: Any, **__: Any) -> None:
        raise RuntimeError("bug in generation")

    monkeypatch.setattr(pipeline, "_candidates_run", broken)
    monkeypatch.setattr(tasks, "fan_out_inline", True)
    item = item_create(queue=queue, input_text="Where is my card?", created_by=user)
    generation = item.generations.get()
    assert tasks.generation_prepare.apply(args=[generation.pk]).successful()
    assert {c.status for c in generation.candidates.all()} == {Candidate.Status.FAILED}
    assert all("internal error" in c.error for c in generation.candidates.all())
    assert Item.objects.get(pk=item.pk).status == Item.Status.FAILED


def test_a_generation_that_cannot_be_prepared_fails_its_item(
    generation: Generation, monkeypatch: pytest.MonkeyPatch
) -> None:
    fresh = item_create(
        queue=generation.item.queue, input_text="Another question", created_by=None
    ).generations.get()
    result = tasks.generation_prepare.apply(kwargs={"generation_id": fresh.pk + 10_000})
    assert result.successful()  # an unknown id is ignored quietly

    def broken_retrieval(**_: Any) -> list[Any]:
        raise RuntimeError("bug in retrieval")

    monkeypatch.setattr(pipeline.memory_selectors, "examples_recall", broken_retrieval)
    assert tasks.generation_prepare.apply(args=[fresh.pk]).failed()
    fresh.refresh_from_db()
    assert fresh.status == Generation.Status.FAILED
    assert {c.status for c in fresh.candidates.all()} == {Candidate.Status.FAILED}
    assert all("preparing the prompt failed" in c.error for c in fresh.candidates.all())
    assert Item.objects.get(pk=fresh.item_id).status == Item.Status.FAILED


def test_without_an_embedding_model_generation_goes_on_without_memory(
    generation: Generation, settings: LazySettings, tmp_path: Path
) -> None:
    from icrlhf.integrations import embeddings

    stored_example(generation.item.queue)  # memory has something to retrieve
    settings.EMBEDDING_MODEL_DIR = tmp_path / "missing"
    embeddings.model_id.cache_clear()
    try:
        fresh = item_create(
            queue=generation.item.queue, input_text="Another question", created_by=None
        ).generations.get()
        pipeline.generation_prepare(generation_id=fresh.pk)
    finally:
        embeddings.model_id.cache_clear()
    fresh.refresh_from_db()
    assert fresh.status == Generation.Status.RUNNING
    assert fresh.retrieval_error == "Memory was unavailable, so no examples were retrieved."


def test_a_queue_with_nothing_waiting_goes_ahead_of_a_flooded_one(queue: Any, user: Any) -> None:
    """Broker priority (0 first) grows with the generations of the same queue in line before
    it; finished ones and other queues' do not count."""
    flood = [item_create(queue=queue, input_text=f"flood {n}", created_by=user) for n in range(9)]
    other = item_create(queue=QueueFactory(), input_text="elsewhere", created_by=user)

    def priority(item: Item) -> int:
        generation = item.generations.get()
        return pipeline.fair_priority(generation_id=generation.pk, queue_id=item.queue_id)

    assert [priority(item) for item in flood] == [0, 1, 2, 2, 3, 3, 3, 3, 4]
    assert priority(other) == 0
    Generation.objects.filter(item__in=flood[:8]).update(status=Generation.Status.DONE)
    assert priority(flood[8]) == 0


def test_generation_tasks_are_sent_at_the_fair_priority(
    queue: Any,
    user: Any,
    vector_store: Path,
    monkeypatch: pytest.MonkeyPatch,
    django_capture_on_commit_callbacks: Any,
) -> None:
    """A test double stands in for the broker here; the real worker's order is tested in
    tests/integration/test_fairness.py."""
    sent: list[tuple[str, int]] = []
    for task in (tasks.generation_prepare, tasks.candidates_generate):
        monkeypatch.setattr(
            task,
            "apply_async",
            lambda args, priority, name=task.name: sent.append((name, priority)),
        )
    with django_capture_on_commit_callbacks(execute=True):
        item_create(queue=queue, input_text="first", created_by=user)
        second = item_create(queue=queue, input_text="second", created_by=user, n_candidates=2)
    with django_capture_on_commit_callbacks(execute=True):
        pipeline.generation_prepare(generation_id=second.generations.get().pk)
    assert sent == [
        ("generation.prepare", 0),
        ("generation.prepare", 1),
        ("generation.candidates_generate", 1),  # one message for its two candidates
    ]
