"""Production traffic back to review, in this process: which calls are captured, the item a
capture makes, duplicates, lost captures, holdout, and that capturing never hurts a response.
The real gateway process, worker and reviewer loop are in test_endpoint.py."""

import json
import logging
import threading
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client, override_settings
from django.utils import timezone

from icrlhf.gateway import capture, services
from icrlhf.gateway import tasks as gateway_tasks
from icrlhf.gateway.models import Call
from icrlhf.gateway.schemas import ChatRequest
from icrlhf.generation import pipeline, recovery
from icrlhf.generation import tasks as generation_tasks
from icrlhf.generation.models import Candidate
from icrlhf.ingest.services import token_create
from icrlhf.memory.selectors import Recall, RetrievedExample
from icrlhf.queues.models import Item, Queue
from icrlhf.queues.services import ROUTING_FIELDS, queue_save, routing_update
from icrlhf.trajectories.feedback import feedback_record
from icrlhf.trajectories.selectors import LowRewardCaptures, low_reward_captures_of
from tests.factories import (
    QueueFactory,
    UserFactory,
    member_add,
    stored_example,
)
from tests.support.llm_answer import LLMAnswer
from tests.support.waiting import wait_for

pytestmark = [
    pytest.mark.django_db(transaction=True),  # the gateway's threads have their own connections
    pytest.mark.urls("icrlhf.gateway.urls"),
    pytest.mark.usefixtures("eager_tasks", "vector_store", "gateway_threads"),
]

QUESTION = "How do I reset my card PIN?"


def app_for(**queue_fields: Any) -> tuple[Client, Any]:
    queue = QueueFactory(slug="helpdesk", n_candidates=3, **queue_fields)
    token = token_create(queue=queue, name="app")[1]
    return Client(headers={"Authorization": f"Bearer {token}"}), queue


def ask(client: Client, text: str = QUESTION) -> Any:
    payload = {"model": "helpdesk", "messages": [{"role": "user", "content": text}]}
    response = client.post("/v1/chat/completions", json.dumps(payload), "application/json")
    assert response.status_code == 200
    return response


def call_of(response: Any) -> Call:
    return Call.objects.get(pk=response["X-Icrlhf-Call"])


def test_a_sampled_call_becomes_an_item_whose_served_answer_is_one_candidate(
    llm_answer: LLMAnswer,
) -> None:
    client, queue = app_for(capture_percent=100)
    llm_answer("Open the app, then Cards › Reset PIN.")
    response = ask(client)

    call = wait_for(lambda: Call.objects.filter(item__isnull=False).first(), what="the capture")
    assert call.pk == call_of(response).pk and call.capture == Call.Capture.SAMPLED
    item = wait_for(
        lambda: Item.objects.filter(pk=call.item_id, status=Item.Status.READY).first(),
        what="the other candidates",
    )
    assert (item.queue, item.source, item.input_text) == (queue, "gateway", QUESTION)
    assert item.metadata == {"call": str(call.pk), "holdout": False}
    assert item.conversation == [{"role": "user", "content": QUESTION}]
    assert item.call_options == {}
    candidates = list(item.generations.get().candidates.all())
    assert len(candidates) == 3 and all(c.status == Candidate.Status.DONE for c in candidates)
    served = [c for c in candidates if c.served]
    assert len(served) == 1
    assert served[0].text == response.json()["choices"][0]["message"]["content"]
    assert served[0].source == Candidate.Source.LLM


def test_which_calls_are_captured() -> None:
    queue = QueueFactory.build(capture_percent=0, capture_below_similarity=0.6)

    def reason(top: float | None, memory: str = Call.Memory.USED) -> str:
        return services.capture_reason(queue=queue, top_score=top, memory=memory)

    assert reason(None, Call.Memory.EMPTY) == reason(0.59) == Call.Capture.UNCOVERED
    assert reason(0.6) == Call.Capture.NONE
    # Memory down: coverage is unknown, so an outage does not send every call to review.
    assert reason(None, Call.Memory.UNAVAILABLE) == Call.Capture.NONE
    queue.capture_below_similarity = None
    assert reason(None, Call.Memory.EMPTY) == Call.Capture.NONE
    queue.capture_percent = 100
    assert reason(0.9) == reason(None, Call.Memory.UNAVAILABLE) == Call.Capture.SAMPLED


def test_an_uncovered_call_is_captured_even_with_no_sample(llm_answer: LLMAnswer) -> None:
    client, _queue = app_for(capture_percent=0, capture_below_similarity=0.5)
    llm_answer("Answer.")
    call = call_of(ask(client))  # nothing is stored: memory covers nothing yet
    assert call.capture == Call.Capture.UNCOVERED and call.top_score is None
    wait_for(lambda: Call.objects.get(pk=call.pk).item_id is not None, what="the capture")


def test_identical_requests_within_the_window_are_captured_once(
    llm_answer: LLMAnswer, settings: Any
) -> None:
    client, queue = app_for(capture_percent=100)
    llm_answer("Answer.")
    first = call_of(ask(client))
    wait_for(lambda: Call.objects.get(pk=first.pk).item_id is not None, what="the capture")
    second = call_of(ask(client))
    wait_for(
        lambda: Call.objects.get(pk=second.pk).capture == Call.Capture.DUPLICATE,
        what="the duplicate to be marked",
    )
    assert Item.objects.filter(queue=queue).count() == 1

    settings.CAPTURE_DEDUPE_WINDOW_S = 0
    third = call_of(ask(client))
    wait_for(lambda: Call.objects.get(pk=third.pk).item_id is not None, what="a later capture")
    assert Item.objects.filter(queue=queue).count() == 2


def test_a_lost_capture_is_swept_and_a_broker_outage_loses_nothing(
    monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    _client, queue = app_for(capture_percent=100)
    lost = Call.objects.create(
        queue=queue,
        source=Call.Source.MODEL,
        memory=Call.Memory.EMPTY,
        request_text=QUESTION,
        answer_text="What the app got.",
        capture=Call.Capture.SAMPLED,
        created_at=timezone.now() - timedelta(minutes=5),
    )
    recent = Call.objects.create(
        queue=queue,
        source=Call.Source.MODEL,
        memory=Call.Memory.EMPTY,
        request_text="Being captured right now",
        capture=Call.Capture.SAMPLED,
    )

    def broker_down(*args: Any, **kwargs: Any) -> None:
        raise ConnectionError("the broker is down")

    monkeypatch.setattr(generation_tasks.generation_prepare, "apply_async", broker_down)
    gateway_tasks.captures_sweep()

    lost.refresh_from_db()
    assert lost.item is not None and lost.item.status == Item.Status.GENERATING
    served = lost.item.generations.get().candidates.get(served=True)
    assert served.text == "What the app got."
    assert Call.objects.get(pk=recent.pk).item is None  # too recent to be called lost
    # Its generation waits for the generation sweeper, which enqueues it when the broker is back.
    generation = lost.item.generations.get()
    assert generation.status == "pending"
    settings.GENERATION_LOST_AFTER_S = 0
    assert recovery.generations_sweep(broker_backlog=0).prepare == [generation.pk]


def run_through(client: Client, run_id: str, turns: list[str]) -> list[Call]:
    """An agent's run of several calls, named by its id, each sending the whole conversation."""
    messages: list[dict[str, Any]] = []
    calls = []
    for text in turns:
        messages.append({"role": "user", "content": text})
        payload = {"model": "helpdesk", "messages": messages}
        response = client.post(
            "/v1/chat/completions",
            json.dumps(payload),
            "application/json",
            headers={"X-Icrlhf-Trajectory": run_id},
        )
        assert response.status_code == 200
        messages.append(
            {"role": "assistant", "content": response.json()["choices"][0]["message"]["content"]}
        )
        calls.append(call_of(response))
    return calls


def test_the_steps_of_a_run_rewarded_below_the_bar_go_to_review(llm_answer: LLMAnswer) -> None:
    llm_answer("Let me look into that for you.")
    client, queue = app_for(capture_percent=0, reward_threshold=0.5, capture_low_reward=True)
    failed = run_through(client, "run-bad", ["My card was swallowed.", "It is still inside."])
    worked = run_through(client, "run-good", ["My card was stolen.", "Please block it."])
    for run_id, success in (("run-bad", False), ("run-good", True)):
        feedback_record(
            queue=queue,
            token=None,
            call_id=None,
            trajectory_ref=run_id,
            reward=None,
            success=success,
        )
    gateway_tasks.captures_sweep()
    captured = {c.pk: c for c in Call.objects.filter(queue=queue, item__isnull=False)}
    assert set(captured) == {c.pk for c in failed}
    assert {c.capture for c in captured.values()} == {Call.Capture.LOW_REWARD}
    second = Item.objects.get(calls=failed[1].pk)
    # The reviewer sees the run so far and answers its second step.
    assert [m["content"] for m in second.conversation if m["role"] == "user"] == [
        "My card was swallowed.",
        "It is still inside.",
    ]
    # A low reward on one call of a good run sends that step alone; a queue that does not
    # ask for it sends nothing.
    feedback_record(
        queue=queue, token=None, call_id=worked[1].pk, trajectory_ref=None, reward=0.1, success=None
    )
    gateway_tasks.captures_sweep()
    assert Call.objects.get(pk=worked[1].pk).capture == Call.Capture.LOW_REWARD
    assert Call.objects.get(pk=worked[0].pk).item is None
    # The other candidates are written with the served answer and its reward in view, as an
    # earlier attempt (a run reported failed without a reward: 0.0).
    assert second.generations.get().candidates.get(served=True).reward == 0.0
    low = Item.objects.get(calls=worked[1].pk).generations.get()
    assert low.candidates.get(served=True).reward == 0.1
    pipeline.generation_prepare(generation_id=low.pk)
    low.refresh_from_db()
    system = low.messages[0]["content"]
    assert (
        "<attempt>\n<response>\nLet me look into that for you.\n</response>\n"
        "<reward>0.10</reward>\n</attempt>"
    ) in system
    assert "Feedback on them: the application rewarded the answer it was served 0.10" in system
    queue.capture_low_reward = False
    queue.save()
    other = run_through(client, "run-other", ["My card is bent."])
    feedback_record(
        queue=queue, token=None, call_id=None, trajectory_ref="run-other", reward=0.0, success=None
    )
    assert capture.low_reward_steps_mark() == 0 and Call.objects.get(pk=other[0].pk).item is None


def test_a_call_whose_item_was_deleted_is_not_captured_again() -> None:
    _client, queue = app_for(capture_percent=100)
    call = Call.objects.create(
        queue=queue,
        source=Call.Source.MODEL,
        memory=Call.Memory.EMPTY,
        request_text=QUESTION,
        capture=Call.Capture.SAMPLED,
        created_at=timezone.now() - timedelta(minutes=5),
    )
    item = capture.call_capture(call_id=call.pk)
    assert item is not None
    item.delete()
    assert Call.objects.get(pk=call.pk).capture == Call.Capture.REMOVED
    assert capture.captures_lost() == []


def test_a_request_too_long_for_an_item_is_not_captured_and_says_why(settings: Any) -> None:
    _client, queue = app_for(capture_percent=100)
    settings.ITEM_INPUT_MAX_CHARS = 10
    call = Call.objects.create(
        queue=queue,
        source=Call.Source.MODEL,
        memory=Call.Memory.EMPTY,
        request_text="A request longer than ten characters",
        capture=Call.Capture.SAMPLED,
    )
    assert capture.call_capture(call_id=call.pk) is None
    call.refresh_from_db()
    assert call.capture == "" and call.error.startswith("Not captured: The input has 36 characters")
    assert not Item.objects.exists()


def test_a_slow_capture_never_delays_the_response(
    llm_answer: LLMAnswer, monkeypatch: pytest.MonkeyPatch
) -> None:
    client, _queue = app_for(capture_percent=100)
    llm_answer("Answer.")
    started, release = threading.Event(), threading.Event()

    def stuck(**_: Any) -> None:
        started.set()
        release.wait(timeout=30)  # a capture stuck behind a lock

    monkeypatch.setattr(capture, "call_capture", stuck)
    try:
        response = ask(client)  # returns while the capture is still stuck
        assert started.wait(timeout=10) and not release.is_set()
        assert response.json()["choices"][0]["message"]["content"] == "Answer."
    finally:
        release.set()


def test_a_failing_capture_never_fails_the_response(
    llm_answer: LLMAnswer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    client, _queue = app_for(capture_percent=100)
    llm_answer("Answer.")

    def broken(**_: Any) -> None:
        raise RuntimeError("the database went away")

    monkeypatch.setattr(capture, "call_capture", broken)
    with caplog.at_level(logging.ERROR):
        response = ask(client)
        wait_for(lambda: "could not be captured" in caplog.text, what="the failure logged")
    assert response.json()["choices"][0]["message"]["content"] == "Answer."
    assert call_of(response).item is None  # the sweeper tries again later


def test_held_out_calls_get_no_memory_and_look_like_calls_memory_could_not_help(
    llm_answer: LLMAnswer, monkeypatch: pytest.MonkeyPatch
) -> None:
    client, queue = app_for(holdout_percent=100, memory_answer_threshold=0.5)
    example = RetrievedExample(
        example=stored_example(
            queue, input_text=QUESTION, output_text="Use the app: Cards › Reset PIN."
        ),
        score=0.97,
        rank=1,
    )
    recall = Recall(examples=[example], neighbours=[example])
    monkeypatch.setattr(services, "examples_recall_anywhere", lambda **_: recall)
    llm_answer("From the model alone.")
    chat = ChatRequest.model_validate(
        {"model": "helpdesk", "messages": [{"role": "user", "content": QUESTION}]}
    )
    plan = services.call_plan(queue=queue, request=chat)
    assert plan.holdout and plan.memory_answer is None and plan.examples == []
    assert example.example.output_text not in json.dumps(plan.messages)

    response = ask(client)
    assert response.json()["choices"][0]["message"]["content"] == "From the model alone."
    assert response["X-Icrlhf-Source"] == "model"  # not answered from memory at 0.97
    assert response["X-Icrlhf-Memory"] == "empty" and response["X-Icrlhf-Examples"] == ""
    call = call_of(response)
    assert call.holdout and call.top_score == pytest.approx(0.97) and call.examples == []

    queue.holdout_percent = 0
    queue.save()
    served = ask(client)
    assert served["X-Icrlhf-Source"] == "memory" and not call_of(served).holdout


def test_a_captured_calls_personal_data_is_redacted_before_it_is_stored(
    llm_answer: LLMAnswer, settings: Any
) -> None:
    """REDACTION=captured (the default): the caller gets the model's answer whole; the call
    log and the review item (and so memory) keep placeholders. A call not captured is kept as
    sent, unless REDACTION=all."""
    assert settings.REDACTION == "captured"
    client, queue = app_for(capture_percent=100)
    llm_answer("We wrote to jane.doe@example.com about card 4111 1111 1111 1111.")
    text = "I'm jane.doe@example.com, IBAN DE89 3704 0044 0532 0130 00, call +44 20 7946 0958"
    response = ask(client, text)
    assert "jane.doe@example.com" in response.json()["choices"][0]["message"]["content"]
    call = call_of(response)
    assert call.request_text == "I'm [email], IBAN [IBAN], call [phone]"
    assert call.answer_text == "We wrote to [email] about card [card number]."
    item = wait_for(lambda: Call.objects.get(pk=call.pk).item, what="the capture")
    assert item.input_text == "I'm [email], IBAN [IBAN], call [phone]"
    served = item.generations.get().candidates.get(served=True)
    assert served.text == "We wrote to [email] about card [card number]."

    queue.capture_percent = 0
    queue.save()
    assert call_of(ask(client, text)).request_text == text  # not captured: as sent
    settings.REDACTION = "all"
    assert "[email]" in call_of(ask(client, text)).request_text


def test_captures_from_a_low_reward_are_capped_per_run_and_wait_for_approval(
    llm_answer: LLMAnswer, settings: Any
) -> None:
    """A failed run of five calls sends its earliest steps to review up to the queue's cap,
    within the token's item limit, and its page says the cap cut some; a run awaiting a
    reviewer's approval sends none; and what was logged raw is redacted on its way in."""
    llm_answer("Write to help@example.com.")
    client, queue = app_for(
        capture_percent=0,
        reward_threshold=0.5,
        capture_low_reward=True,
        low_reward_captures_per_run=2,
    )
    turns = [
        f"Card 4111 1111 1111 1111 fails, try {n}, mail me at ana@example.com" for n in range(5)
    ]
    calls = run_through(client, "run-long", turns)
    assert "ana@example.com" in Call.objects.get(pk=calls[0].pk).request_text  # logged raw
    feedback_record(
        queue=queue, token=None, call_id=None, trajectory_ref="run-long", reward=0.0, success=None
    )
    gateway_tasks.captures_sweep()
    captured = list(Call.objects.filter(queue=queue, item__isnull=False).order_by("created_at"))
    assert [c.pk for c in captured] == [calls[0].pk, calls[1].pk]
    for call in captured:
        stored = json.dumps(
            [call.request_text, call.context, call.answer_text, call.item.input_text]
        )
        assert "ana@example.com" not in stored and "4111 1111" not in stored, stored
        assert "help@example.com" not in stored and "[email]" in stored
    gateway_tasks.captures_sweep()  # again: the cap holds
    assert Call.objects.filter(queue=queue, item__isnull=False).count() == 2
    reviewer = UserFactory()
    member_add(queue, reviewer, "reviewer")
    page = Client()
    page.force_login(reviewer)
    run = captured[0].step.trajectory
    assert low_reward_captures_of(run) == LowRewardCaptures(low=5, sent=2, cap=2)
    with override_settings(ROOT_URLCONF="icrlhf.urls"):  # the web app's page
        shown = page.get(f"/q/{queue.slug}/trajectories/{run.pk}/")
    assert "2 of this run’s 5 steps rewarded below the bar went to review" in shown.content.decode()

    # Awaiting approval: nothing is captured until a reviewer approves.
    queue.rewards_need_approval = True
    queue.save()
    pending = run_through(client, "run-pending", ["My card was swallowed."])
    feedback_record(
        queue=queue,
        token=None,
        call_id=None,
        trajectory_ref="run-pending",
        reward=0.0,
        success=None,
    )
    gateway_tasks.captures_sweep()
    assert Call.objects.get(pk=pending[0].pk).capture == Call.Capture.NONE

    # Over the token's item limit, a capture waits for the next minute's sweep.
    queue.rewards_need_approval = False
    queue.save()
    settings.TICKETS_PER_MINUTE_PER_TOKEN = 0
    limited = run_through(client, "run-limited", ["My card is bent."])
    feedback_record(
        queue=queue,
        token=None,
        call_id=None,
        trajectory_ref="run-limited",
        reward=0.0,
        success=None,
    )
    gateway_tasks.captures_sweep()
    waiting = Call.objects.get(pk=limited[0].pk)
    assert (waiting.capture, waiting.item) == (Call.Capture.LOW_REWARD, None)


def test_turning_low_reward_captures_on_never_reaches_back_to_runs_rewarded_before(
    llm_answer: LLMAnswer,
) -> None:
    """Issue 46: turning the rule on sent runs reported failed before it existed to review.
    Only runs rewarded (or reported failed) from the moment it is turned on are captured."""
    llm_answer("Let me look into that for you.")
    client, queue = app_for(capture_percent=0, reward_threshold=0.5)
    failed_before = run_through(client, "run-before", ["My card was swallowed."])
    low_before = run_through(client, "step-before", ["My card is bent."])
    feedback_record(
        queue=queue,
        token=None,
        call_id=None,
        trajectory_ref="run-before",
        reward=None,
        success=False,
    )
    feedback_record(
        queue=queue,
        token=None,
        call_id=low_before[0].pk,
        trajectory_ref=None,
        reward=0.1,
        success=None,
    )
    gateway_tasks.captures_sweep()  # the rule is off: nothing
    # A curator turns the rule on, on the queue's routing page.
    routing = {name: getattr(queue, name) for name in ROUTING_FIELDS}
    routing_update(
        queue_id=queue.pk, values={**routing, "capture_low_reward": True}, actor=UserFactory()
    )
    failed_after = run_through(client, "run-after", ["My card was stolen."])
    feedback_record(
        queue=queue,
        token=None,
        call_id=None,
        trajectory_ref="run-after",
        reward=None,
        success=False,
    )
    gateway_tasks.captures_sweep()
    captured = set(
        Call.objects.filter(queue=queue, item__isnull=False).values_list("pk", flat=True)
    )
    assert captured == {failed_after[0].pk}
    assert Call.objects.get(pk=failed_before[0].pk).capture == Call.Capture.NONE

    # Rewarded low again after the rule: that reward is the rule's to act on.
    feedback_record(
        queue=queue, token=None, call_id=None, trajectory_ref="run-before", reward=0.0, success=None
    )
    gateway_tasks.captures_sweep()
    assert Call.objects.get(pk=failed_before[0].pk).item is not None
    assert Call.objects.get(pk=low_before[0].pk).item is None

    # Saved again while on (the admin's save), the moment stays; off and on again, it moves.
    queue.refresh_from_db()
    turned_on = queue.capture_low_reward_since
    assert turned_on is not None
    queue_save(queue=queue)
    assert Queue.objects.get(pk=queue.pk).capture_low_reward_since == turned_on
    queue.capture_low_reward = False
    queue_save(queue=queue)
    queue.capture_low_reward = True
    queue_save(queue=queue)
    assert Queue.objects.get(pk=queue.pk).capture_low_reward_since > turned_on


def test_a_low_reward_capture_deleted_or_found_a_duplicate_keeps_its_slot_in_the_cap(
    llm_answer: LLMAnswer,
) -> None:
    """The cap counts every capture a run has had: one whose review item was deleted, or that
    turned out identical to a recent capture, does not let the next step of the run in."""
    llm_answer("Let me look into that for you.")
    client, queue = app_for(
        capture_percent=0,
        reward_threshold=0.5,
        capture_low_reward=True,
        low_reward_captures_per_run=1,
    )
    # Two runs that begin with the same words: their first calls are identical requests.
    turns = ["My card was swallowed.", "It is still inside.", "Please help."]
    deleted = run_through(client, "run-deleted", turns)
    duplicate = run_through(client, "run-duplicate", turns)
    for run_id in ("run-deleted", "run-duplicate"):
        feedback_record(
            queue=queue, token=None, call_id=None, trajectory_ref=run_id, reward=0.0, success=None
        )
    gateway_tasks.captures_sweep()
    first = Call.objects.get(pk=deleted[0].pk)
    assert first.item is not None
    assert Call.objects.get(pk=duplicate[0].pk).capture == Call.Capture.DUPLICATE
    first.item.delete()
    assert Call.objects.get(pk=first.pk).capture == Call.Capture.REMOVED

    gateway_tasks.captures_sweep()
    later = [*deleted[1:], *duplicate[1:]]
    assert list(
        Call.objects.filter(pk__in=[c.pk for c in later]).values_list("capture", flat=True)
    ) == [Call.Capture.NONE] * len(later)
    assert not Item.objects.filter(calls__in=[c.pk for c in later]).exists()


def test_a_captured_calls_item_keeps_the_tools_redacted_and_not_who_asked(
    llm_answer: LLMAnswer, settings: Any
) -> None:
    """A call's options (`user`, the tools) are redacted as its words are, and its review
    item copies the tools review needs but not the end user the call named."""
    assert settings.REDACTION == "captured"
    client, queue = app_for(capture_percent=100)
    llm_answer("Done.")
    tool = {
        "type": "function",
        "function": {"name": "mail", "description": "Mail jane.doe@example.com"},
    }
    payload = {
        "model": "helpdesk",
        "messages": [{"role": "user", "content": QUESTION}],
        "tools": [tool],
        "user": "jane.doe@example.com",
    }
    response = client.post("/v1/chat/completions", json.dumps(payload), "application/json")
    assert response.status_code == 200
    call = call_of(response)
    item = wait_for(lambda: Call.objects.get(pk=call.pk).item, what="the capture")
    assert "jane.doe@example.com" not in json.dumps(call.options)
    assert "user" not in item.call_options
    assert item.call_options["tools"][0]["function"] == {
        "name": "mail",
        "description": "Mail [email]",
    }
