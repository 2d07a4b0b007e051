"""The call log written after the answer, through the journal on the machine's Redis: the
answer does not wait for its row; the writer writes the row and the run's step, redacted,
once and in the order the calls were answered; feedback posted as soon as the answer arrives
finds its call and its run, and waits for nothing else; a row the database keeps refusing
becomes a dead letter, on the health page. (A gateway process killed mid-burst:
tests/integration/test_call_log_kill.py.)"""

import json
import threading
import time
import uuid
from typing import Any

import pytest
from django.test import Client

from icrlhf.gateway import call_log, services
from icrlhf.gateway.models import Call
from icrlhf.ingest.models import IntegrationToken
from icrlhf.ingest.services import token_create
from icrlhf.integrations import journal
from icrlhf.trajectories.feedback import FeedbackTargetMissing, feedback_record
from icrlhf.trajectories.models import Trajectory
from icrlhf.trajectories.services import end_user_key
from tests.factories import QueueFactory
from tests.support.llm_answer import LLMAnswer
from tests.support.waiting import wait_for

pytestmark = [
    pytest.mark.django_db(transaction=True),  # the gateway's threads have their own connections
    pytest.mark.urls("icrlhf.gateway.urls"),
    pytest.mark.usefixtures("vector_store", "gateway_threads", "redis_cache"),
]


def app(slug: str = "helpdesk") -> tuple[Client, Any, IntegrationToken]:
    queue = QueueFactory(slug=slug, capture_below_similarity=None)
    record, secret = token_create(queue=queue, name="app")
    return Client(headers={"Authorization": f"Bearer {secret}"}), queue, record


def ask(
    client: Client,
    messages: list[dict[str, Any]],
    headers: dict[str, str] | None = None,
    model: str = "helpdesk",
) -> str:
    payload = {"model": model, "messages": messages}
    response = client.post(
        "/v1/chat/completions", json.dumps(payload), "application/json", headers=headers
    )
    assert response.status_code == 200
    return str(response["X-Icrlhf-Call"])


def test_the_answer_goes_first_and_the_writer_writes_its_row_and_step_redacted(
    llm_answer: LLMAnswer, settings: Any
) -> None:
    settings.REDACTION = "all"
    client, queue, _ = app()
    llm_answer("We will write to you.")

    call_id = ask(client, [{"role": "user", "content": "I am jane@example.com, help"}])

    assert not Call.objects.filter(pk=call_id).exists()
    assert journal.pending(journal.CALLS, call_id)
    assert call_log.writer().drain() == 1
    call = Call.objects.get(pk=call_id)
    assert (call.queue, call.answer_text, call.status_code) == (queue, "We will write to you.", 200)
    assert "jane@example.com" not in call.request_text + json.dumps(call.context)
    assert call.step.trajectory.steps.count() == 1
    assert not journal.pending(journal.CALLS, call_id)


def test_an_entry_written_twice_is_one_row_and_one_step(llm_answer: LLMAnswer) -> None:
    client, _, _ = app()
    llm_answer("Answer.")
    call_id = ask(client, [{"role": "user", "content": "Where is my card?"}])
    entries, _, _ = journal._keys(journal.CALLS)
    raw = journal._client().hget(entries, call_id)
    assert raw is not None
    entry = json.loads(raw)["entry"]

    call_log.entry_write(entry)
    call_log.entry_write(entry)

    assert Call.objects.filter(pk=call_id).count() == 1
    assert services.call_record(services.CallLogged.of_entry(entry)) is None
    assert Trajectory.objects.get().steps.count() == 1


def test_an_agents_calls_are_written_in_the_order_answered_as_one_run(
    llm_answer: LLMAnswer,
) -> None:
    client, _, _ = app()
    llm_answer("Which order?")
    first = [{"role": "user", "content": "Where is my parcel?"}]
    ask(client, first)
    llm_answer("It left today.")
    ask(
        client,
        [
            *first,
            {"role": "assistant", "content": "Which order?"},
            {"role": "user", "content": "1234"},
        ],
    )

    assert call_log.writer().drain() == 2

    run = Trajectory.objects.get()  # the second call continued the first's run
    assert [step.action_text for step in run.steps.order_by("position")] == [
        "Which order?",
        "It left today.",
    ]


def test_feedback_posted_as_the_answer_arrives_finds_its_call_and_its_run(
    llm_answer: LLMAnswer,
) -> None:
    client, queue, token = app()
    llm_answer("Done.")
    on_call = ask(client, [{"role": "user", "content": "Cancel my order"}])
    ask(
        client,
        [{"role": "user", "content": "Refund me"}],
        headers={"X-Icrlhf-Trajectory": "refund-7"},
    )
    # The writer comes a moment later, as under load; the feedback does not 404 meanwhile.
    threading.Timer(0.3, call_log.writer().drain).start()

    by_call = feedback_record(
        queue=queue,
        token=token,
        call_id=uuid.UUID(on_call),
        trajectory_ref=None,
        reward=1.0,
        success=None,
    )
    by_run = feedback_record(
        queue=queue,
        token=token,
        call_id=None,
        trajectory_ref="refund-7",
        reward=None,
        success=True,
    )

    assert by_call.feedback.step is not None and str(by_call.feedback.step.call_id) == on_call
    assert by_run.feedback.trajectory.key == "refund-7"


def test_a_journal_out_of_reach_logs_the_call_in_place(
    llm_answer: LLMAnswer, monkeypatch: pytest.MonkeyPatch
) -> None:
    def unreachable(*_: Any, **__: Any) -> None:
        raise journal.JournalUnavailable("Redis went away")

    monkeypatch.setattr(journal, "add", unreachable)  # test double: Redis failing on add only
    client, _, _ = app()
    llm_answer("Answer.")

    call_id = ask(client, [{"role": "user", "content": "Where is my card?"}])

    assert Call.objects.filter(pk=call_id).exists()


def test_a_row_whose_queue_or_token_was_deleted_since_the_answer_leaves_the_journal(
    llm_answer: LLMAnswer,
) -> None:
    client, queue, token = app()
    llm_answer("Answer.")
    tokenless = ask(client, [{"role": "user", "content": "Where is my card?"}])
    token.delete()  # revoked and deleted before the writer came
    assert call_log.writer().drain() == 1

    call = Call.objects.get(pk=tokenless)
    assert call.token is None and not hasattr(call, "step")  # no owner left for a run
    assert not journal.pending(journal.CALLS, tokenless)

    other, other_queue, _ = app(slug="desk")
    llm_answer("Answer.")
    queueless = ask(other, [{"role": "user", "content": "Where is my card?"}], model="desk")
    other_queue.delete()  # its calls go with it
    assert call_log.writer().drain() == 1

    assert not Call.objects.filter(pk=queueless).exists()
    assert not journal.pending(journal.CALLS, queueless)


def test_another_token_of_the_queue_cannot_reach_a_call_still_on_its_way_to_the_log(
    llm_answer: LLMAnswer,
) -> None:
    client, queue, _ = app()
    other = token_create(queue=queue, name="another app")[0]
    llm_answer("Done.")
    call_id = ask(client, [{"role": "user", "content": "Cancel my order"}])
    threading.Timer(0.3, call_log.writer().drain).start()

    with pytest.raises(FeedbackTargetMissing):
        feedback_record(
            queue=queue,
            token=other,
            call_id=uuid.UUID(call_id),
            trajectory_ref=None,
            reward=0.0,
            success=None,
        )

    call = wait_for(lambda: Call.objects.filter(pk=call_id).first(), what="the row written")
    assert call.step.reward is None and not call.step.trajectory.feedback.exists()


def test_feedback_on_a_run_no_pending_call_of_its_token_named_answers_at_once(
    llm_answer: LLMAnswer,
) -> None:
    """Feedback waits for the token's own calls that named the run, and for no others: not
    another token's (another tenant's) pending calls, nor the same token's under other keys."""
    client, queue, token = app()
    other, _, _ = app(slug="desk")
    llm_answer("Done.")
    ask(other, [{"role": "user", "content": "Hi"}], {"X-Icrlhf-Trajectory": "run-1"}, "desk")
    ask(client, [{"role": "user", "content": "Hi"}], {"X-Icrlhf-Trajectory": "run-2"})
    ask(client, [{"role": "user", "content": "Hello"}])
    another_tokens_call = ask(other, [{"role": "user", "content": "Hey"}], model="desk")
    assert journal.counts(journal.CALLS).waiting == 4  # no writer: all of them pending

    started = time.monotonic()
    for reference in ("run-1", "unknown", ""):
        with pytest.raises(FeedbackTargetMissing):
            feedback_record(
                queue=queue,
                token=token,
                call_id=None,
                trajectory_ref=reference,
                reward=None,
                success=True,
            )
    with pytest.raises(FeedbackTargetMissing):
        feedback_record(
            queue=queue,
            token=token,
            call_id=uuid.UUID(another_tokens_call),
            trajectory_ref=None,
            reward=1.0,
            success=None,
        )
    assert time.monotonic() - started < 1.0


def test_feedback_on_a_run_whose_first_call_is_pending_waits_and_finds_it(
    llm_answer: LLMAnswer,
) -> None:
    client, queue, token = app()
    llm_answer("Done.")
    ask(client, [{"role": "user", "content": "Refund me"}], {"X-Icrlhf-Trajectory": "run-9"})
    threading.Timer(0.5, call_log.writer().drain).start()

    started = time.monotonic()
    recorded = feedback_record(
        queue=queue, token=token, call_id=None, trajectory_ref="run-9", reward=None, success=True
    )

    assert recorded.feedback.trajectory.key == "run-9"
    assert 0.4 < time.monotonic() - started < 5


def test_a_row_the_database_keeps_refusing_is_a_dead_letter_on_the_health_page(
    llm_answer: LLMAnswer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An entry no database can store (here: what 1e999 was before the gateway refused it)
    is tried a few times, set aside, and counted; the run's next call is written meanwhile."""
    monkeypatch.setattr(journal, "TRIES", 2)
    client, _, _ = app()
    llm_answer("Which order?")
    first = [{"role": "user", "content": "Where is my parcel?"}]
    refused = ask(client, first, {"X-Icrlhf-Trajectory": "parcel"})
    entries, _, _ = journal._keys(journal.CALLS)
    raw = journal._client().hget(entries, refused)
    assert raw is not None
    body = json.loads(raw)
    body["entry"]["options"]["limit"] = float("inf")  # json.dumps writes Infinity
    journal._client().hset(entries, refused, json.dumps(body))
    llm_answer("It left today.")
    turns = [
        *first,
        {"role": "assistant", "content": "Which order?"},
        {"role": "user", "content": "1"},
    ]
    later = ask(client, turns, {"X-Icrlhf-Trajectory": "parcel"})

    assert call_log.writer().drain() == 0  # the run's later call waits for the refused one
    assert not Call.objects.exists()
    assert call_log.writer().drain() == 1  # refused again: set aside, the later one goes on

    assert not Call.objects.filter(pk=refused).exists()
    assert Call.objects.get(pk=later).step.trajectory.key == "parcel"
    health = Client().get("/healthz")
    assert health.status_code == 200
    assert health.content.decode() == "ok\ncall log journal: 0 waiting, 1 dead letters\n"
    [letter] = journal.dead_letters(journal.CALLS)
    assert letter["key"] == refused


def journaled(call_id: str) -> str:
    """The call's journal entry as it waits in Redis for the writer."""
    entries, _, _ = journal._keys(journal.CALLS)
    raw = journal._client().hget(entries, call_id)
    assert raw is not None
    return raw.decode() if isinstance(raw, bytes) else str(raw)


@pytest.mark.parametrize("mode", ["all", "captured"])
def test_the_journal_holds_the_call_redacted_and_its_end_user_as_a_keyed_hash(
    llm_answer: LLMAnswer, settings: Any, mode: str
) -> None:
    """What waits in Redis for the writer is redacted already (REDACTION="captured": a call
    review takes), the end user (`user`) is a keyed hash there and in the log, and the run is
    still recognised from the call as its caller has it: the next call, which sends the
    model's answer back whole, continues it."""
    settings.REDACTION = mode
    client, queue, _ = app()
    queue.capture_percent = 100  # under "captured", this call goes to review
    queue.save()
    llm_answer("We will write to jane@example.com.")
    asked = {"role": "user", "content": "I am jane@example.com, card 4111 1111 1111 1111"}
    tool = {"type": "function", "function": {"name": "mail", "description": "jane@example.com"}}
    payload = {"model": "helpdesk", "messages": [asked], "user": "jane-42", "tools": [tool]}
    response = client.post("/v1/chat/completions", json.dumps(payload), "application/json")
    assert response.status_code == 200
    assert "jane@example.com" in response.json()["choices"][0]["message"]["content"]
    first = str(response["X-Icrlhf-Call"])

    entry = journaled(first)
    for personal in ("jane@example.com", "4111 1111", "jane-42"):
        assert personal not in entry, (personal, entry)
    assert call_log.writer().drain() == 1
    call = Call.objects.get(pk=first)
    stored = json.dumps([call.request_text, call.context, call.answer_text, call.options])
    assert "jane@example.com" not in stored and "[email]" in stored
    assert call.options["user"] not in ("", "jane-42")
    run = call.step.trajectory
    assert run.end_user == call.options["user"]

    llm_answer("Done.")
    answered = {"role": "assistant", "content": "We will write to jane@example.com."}
    thanks = {"role": "user", "content": "Thanks"}
    payload["messages"] = [asked, answered, thanks]
    response = client.post("/v1/chat/completions", json.dumps(payload), "application/json")
    assert response.status_code == 200
    assert call_log.writer().drain() == 1
    second = Call.objects.get(pk=response["X-Icrlhf-Call"])
    assert second.step.trajectory == run
    assert [m["content"] for m in second.step.observation] == ["Thanks"]


def test_a_call_captured_mode_does_not_take_is_journaled_as_sent(
    llm_answer: LLMAnswer, settings: Any
) -> None:
    """REDACTION="captured" keeps a call nobody captured as sent: nothing is redacted for it
    (redaction costs the gateway's threads time), only its end user is hashed."""
    settings.REDACTION = "captured"
    client, _, _ = app()
    llm_answer("Noted.")
    payload = {
        "model": "helpdesk",
        "messages": [{"role": "user", "content": "I am jane@example.com"}],
        "user": "jane-42",
    }
    response = client.post("/v1/chat/completions", json.dumps(payload), "application/json")
    assert response.status_code == 200
    entry = journaled(str(response["X-Icrlhf-Call"]))
    assert "jane@example.com" in entry and "jane-42" not in entry


def test_an_entry_journaled_as_sent_by_the_previous_version_is_written_redacted(
    llm_answer: LLMAnswer, settings: Any
) -> None:
    """An entry left in the journal by a gateway of the version before (the call as it
    arrived, no digests) is written as today's would be: redacted, its end user hashed, its
    run recognised."""
    settings.REDACTION = "all"
    client, queue, token = app()
    llm_answer("Answer.")
    model = json.loads(journaled(ask(client, [{"role": "user", "content": "Where is my card?"}])))
    assert call_log.writer().drain() == 1
    legacy = {
        name: value
        for name, value in model["entry"].items()
        if name not in ("continuation_hash", "prefix_hashes", "tool_names")
    }
    call_id = str(uuid.uuid4())
    said = "I am jane@example.com"
    legacy |= {
        "call_id": call_id,
        "request_text": said,
        "context": [{"role": "user", "content": said}],
        "answer_text": "Hello jane@example.com",
        "options": {"user": "jane-42"},
        "end_user": "jane-42",
    }
    call_log.entry_write(legacy)

    call = Call.objects.get(pk=call_id)
    stored = json.dumps([call.request_text, call.context, call.answer_text, call.options])
    assert "jane@example.com" not in stored and "jane-42" not in stored
    assert call.step.trajectory.end_user == end_user_key("jane-42")
    echoed = [
        {"role": "user", "content": said},
        {"role": "assistant", "content": "Hello jane@example.com"},
        {"role": "user", "content": "Thanks"},
    ]
    llm_answer("You are welcome.")
    payload = {"model": "helpdesk", "messages": echoed, "user": "jane-42"}
    response = client.post("/v1/chat/completions", json.dumps(payload), "application/json")
    assert call_log.writer().drain() == 1
    assert Call.objects.get(pk=response["X-Icrlhf-Call"]).step.trajectory == call.step.trajectory
