"""Grouping calls into trajectories: by the caller's id, or because a call's messages continue
an earlier call's conversation and answer."""

import json
import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from icrlhf.gateway.models import Call
from icrlhf.gateway.retention import calls_purge
from icrlhf.ingest.services import token_create
from icrlhf.queues.models import Queue
from icrlhf.trajectories.models import Feedback, Step, Trajectory
from icrlhf.trajectories.services import RunOwner, StepRecorded, run_hashes, step_record
from tests.factories import QueueFactory, agent_step

pytestmark = pytest.mark.django_db

SYSTEM = {"role": "system", "content": "You are a shop's support agent."}
GOAL = {"role": "user", "content": "My order 4821 arrived broken."}
LOOKUP = {
    "id": "call_a1",
    "type": "function",
    "function": {"name": "lookup_order", "arguments": json.dumps({"order_id": "4821"})},
}
RESULT = {"role": "tool", "tool_call_id": "call_a1", "content": '{"condition": "damaged"}'}


def _record(
    queue: Queue,
    messages: list[dict[str, Any]],
    *,
    key: str = "",
    text: str = "",
    tool_calls: list[dict[str, Any]] | None = None,
) -> StepRecorded:
    return agent_step(
        queue,
        messages,
        key=key,
        text=text,
        tool_calls=tool_calls,
        tool_names=["lookup_order", "refund"],
    )


def test_a_tool_loop_without_an_id_is_one_trajectory_of_steps() -> None:
    queue = QueueFactory()
    first = _record(queue, [SYSTEM, GOAL], tool_calls=[LOOKUP])
    # The client sends the call back as the openai SDK dumps it (content absent, not None).
    echoed = {"role": "assistant", "tool_calls": [LOOKUP]}
    second = _record(queue, [SYSTEM, GOAL, echoed, RESULT], text="Refunded.")
    assert second.trajectory == first.trajectory
    trajectory = Trajectory.objects.get()
    assert (trajectory.goal, trajectory.step_count) == (GOAL["content"], 2)
    assert trajectory.grouping == Trajectory.Grouping.CONTINUATION
    assert trajectory.tool_names == ["lookup_order", "refund"]
    steps = list(trajectory.steps.order_by("position"))
    assert [s.position for s in steps] == [0, 1]
    assert steps[0].observation == [GOAL] and steps[0].tool_calls == [LOOKUP]
    assert steps[1].observation == [RESULT]  # what the agent saw since its last step
    assert steps[1].action_text == "Refunded." and steps[1].tool_calls == []

    # A chat's next turn continues it as well: the answer, then the user's next words.
    follow_up = {"role": "user", "content": "Thanks. When does the money arrive?"}
    answer = {"role": "assistant", "content": "Refunded."}
    third = _record(queue, [SYSTEM, GOAL, echoed, RESULT, answer, follow_up], text="In 3 days.")
    assert third.trajectory == first.trajectory and third.step.position == 2
    assert third.step.observation == [follow_up]


def test_a_new_conversation_or_another_answer_begins_another_trajectory() -> None:
    queue = QueueFactory()
    first = _record(queue, [GOAL], tool_calls=[LOOKUP])
    other_call = {**LOOKUP, "id": "call_zz"}  # not the answer this conversation was given
    stray = _record(queue, [GOAL, {"role": "assistant", "tool_calls": [other_call]}, RESULT])
    fresh = _record(queue, [GOAL], tool_calls=[LOOKUP])
    assert len({first.trajectory.pk, stray.trajectory.pk, fresh.trajectory.pk}) == 3
    # Another queue's conversation never continues this one's.
    elsewhere = _record(QueueFactory(), [GOAL, {"role": "assistant", "tool_calls": [LOOKUP]}])
    assert elsewhere.trajectory.queue != queue


def test_calls_that_name_their_run_are_grouped_by_it_per_queue() -> None:
    queue, other = QueueFactory(), QueueFactory()
    run = str(uuid.uuid4())
    first = _record(queue, [GOAL], key=run, tool_calls=[LOOKUP])
    # Even when the messages do not continue each other (an agent that sends only the latest
    # observation), the id groups them; what is new since the last step is the observation.
    second = _record(queue, [RESULT], key=run, text="Refunded.")
    third = _record(other, [GOAL], key=run)
    assert first.trajectory == second.trajectory != third.trajectory
    assert first.trajectory.grouping == Trajectory.Grouping.KEY
    assert second.step.position == 1 and second.step.observation == [RESULT]
    continued = _record(
        queue, [GOAL, {"role": "assistant", "tool_calls": [LOOKUP]}, RESULT], key=run
    )
    assert continued.step.observation == [RESULT]


def test_two_runs_that_began_alike_stay_two_runs() -> None:
    """Two people say the same first words and get the same answer; each goes on in their own
    run (only a run's latest step is continued)."""
    queue = QueueFactory()
    greeting = {"role": "assistant", "content": "Hello! How can I help?"}
    hello = {"role": "user", "content": "hi"}
    first = _record(queue, [hello], text=greeting["content"])
    second = _record(queue, [hello], text=greeting["content"])
    ana = _record(queue, [hello, greeting, {"role": "user", "content": "My card is lost."}])
    ben = _record(queue, [hello, greeting, {"role": "user", "content": "Where is my order?"}])
    assert first.trajectory != second.trajectory
    runs = {ana.trajectory.pk, ben.trajectory.pk}
    assert len(runs) == 2 and (first.trajectory.pk in runs or second.trajectory.pk in runs)


def test_a_redacted_answer_is_still_recognised_when_the_caller_sends_it_back() -> None:
    queue = QueueFactory()
    said = "Write to ana@example.com."
    first = step_record(
        queue=queue,
        owner=RunOwner(token_id=None),
        key="",
        messages=[GOAL],
        # As the caller got it.
        hashes=run_hashes(messages=[GOAL], answer_text=said, tool_calls=[]),
        decision_point=GOAL["content"],
        action_text="Write to [EMAIL].",  # as stored
        tool_calls=[],
        tool_names=[],
        call_id=None,
        created_at=timezone.now(),
    )
    thanks = {"role": "user", "content": "Thanks"}
    follow = _record(queue, [GOAL, {"role": "assistant", "content": said}, thanks])
    assert follow.trajectory == first.trajectory


def test_retention_blanks_every_column_of_end_users_words_resumed_runs_too(
    settings: Any,
) -> None:
    """Every column that holds what end users wrote or who they are (docs/operators.md's
    Security section lists them) is blank after the purge, for a run with a goal and for a
    resumed run (its first call began mid-conversation: no goal)."""
    queue = QueueFactory()
    record, _ = token_create(queue=queue, name="agent")
    said = "Card 4111 1111 1111 1111, mail ana@example.com"
    refund = {**LOOKUP, "function": {"name": "refund", "arguments": json.dumps({"note": said})}}
    runs = [
        agent_step(
            queue,
            [SYSTEM, {"role": "user", "content": said}],
            key="ana-run-1",
            text=said,
            token=record,
            end_user="ana-42",
            call_id=None,
        ),
        # Resumed: the first message it sees is a tool result, so no goal is recorded.
        agent_step(
            queue,
            [{"role": "tool", "tool_call_id": "x", "content": said}],
            tool_calls=[refund],
            token=record,
            end_user="ana-42",
        ),
    ]
    for number, recorded in enumerate(runs):
        call = Call.objects.create(
            queue=queue,
            token=record,
            source="model",
            memory="used",
            request_text=said,
            context=[{"role": "user", "content": said}],
            answer_text=said,
            tool_calls=[refund],
            options={"user": "ana-42", "tools": [{"type": "function"}]},
            error=said,
            request_hash="a" * 64,
        )
        Step.objects.filter(pk=recorded.step.pk).update(call=call)
        Feedback.objects.create(
            queue=queue,
            trajectory=recorded.trajectory,
            token=record,
            key=f"ana-fb-{number}",
            reward=1,
            comment=said,
            corrected_action={"content": said},
        )
    settings.CALL_RETENTION_DAYS = 30
    calls_purge(now=timezone.now() + timedelta(days=31))
    left = json.dumps(
        [
            list(Trajectory.objects.values("goal", "key", "end_user")),
            list(Step.objects.values("observation", "decision_point", "action_text", "tool_calls")),
            list(Feedback.objects.values("comment", "corrected_action", "key")),
            list(
                Call.objects.values(
                    "request_text",
                    "context",
                    "answer_text",
                    "tool_calls",
                    "options",
                    "error",
                    "request_hash",
                )
            ),
        ]
    )
    for personal in ("4111", "ana@example.com", "ana-42", "ana-run-1", "ana-fb", "a" * 64):
        assert personal not in left, (personal, left)
    assert Trajectory.objects.filter(purged_at__isnull=False).count() == 2
    # A purged run can never be continued (its new steps would outlive the period).
    assert set(Step.objects.values_list("continuation_hash", flat=True)) == {""}
    assert sorted(Trajectory.objects.values_list("step_count", flat=True)) == [1, 1]
    assert Feedback.objects.filter(reward=1).count() == 2  # figures stay


def test_a_run_belongs_to_its_token_and_end_user_however_alike_the_calls() -> None:
    """The live probe: token A asks, token B sends A's question and A's answer back with its
    own words. B's call begins a run of B's, never joins A's; the same for two end users of
    one token; and a key names a run among its owner's runs only."""
    queue = QueueFactory()
    alice, _ = token_create(queue=queue, name="app A")
    bob, _ = token_create(queue=queue, name="app B")
    asked = {"role": "user", "content": "My card is blocked."}
    answer = "I have unblocked it."
    first = agent_step(queue, [asked], text=answer, token=alice)
    again = [asked, {"role": "assistant", "content": answer}, {"role": "user", "content": "Me?"}]
    other_token = agent_step(queue, again, text="Yes.", token=bob)
    assert other_token.trajectory != first.trajectory
    assert other_token.trajectory.token == bob
    other_user = agent_step(queue, again, text="Yes.", token=alice, end_user="someone-else")
    assert other_user.trajectory not in (first.trajectory, other_token.trajectory)
    same_owner = agent_step(queue, again, text="Yes.", token=alice)
    assert same_owner.trajectory == first.trajectory
    # One key, three owners: three runs.
    named = [
        agent_step(queue, [asked], key="probe-run-42", token=owner, end_user=user).trajectory
        for owner, user in ((alice, ""), (bob, ""), (alice, "u2"))
    ]
    assert len({run.pk for run in named}) == 3
    assert agent_step(queue, [asked], key="probe-run-42", token=bob).trajectory == named[1]


def test_a_new_run_without_an_id_is_created_with_its_first_step_counted(
    django_assert_num_queries: Any,
) -> None:
    queue = QueueFactory()
    # Inside the test's transaction: a savepoint and its release, the run, the step. The
    # count is not read back: nothing else can reach a run before its first step is stored.
    with django_assert_num_queries(4):
        first = _record(queue, [SYSTEM, GOAL], tool_calls=[LOOKUP])
    assert (first.trajectory.step_count, first.step.position) == (1, 0)
    echoed = {"role": "assistant", "tool_calls": [LOOKUP]}
    second = _record(queue, [SYSTEM, GOAL, echoed, RESULT], text="Refunded.")
    assert second.trajectory == first.trajectory
    assert (second.trajectory.step_count, second.step.position) == (2, 1)
    assert Trajectory.objects.get().step_count == 2


def test_a_run_continued_daily_under_one_key_keeps_only_the_recent_steps_words(
    settings: Any,
) -> None:
    """Retention goes by each step's and each feedback's own age: a run an agent continues
    every day under one key, for longer than the period, loses its old steps' words (and its
    goal, the first step's), its old feedback's comments and corrections, while its recent
    steps keep theirs and the run goes on under its key."""
    settings.CALL_RETENTION_DAYS = 30
    queue = QueueFactory()
    record, _ = token_create(queue=queue, name="agent")
    start = timezone.now() - timedelta(days=44)
    messages: list[dict[str, Any]] = [SYSTEM]
    for day in range(45):
        messages = [*messages, {"role": "user", "content": f"Day {day}: mail ana{day}@example.com"}]
        recorded = agent_step(
            queue,
            messages,
            key="daily",
            text=f"Noted on day {day}.",
            token=record,
            end_user="ana-42",
            created_at=start + timedelta(days=day),
        )
        messages = [*messages, {"role": "assistant", "content": f"Noted on day {day}."}]
        Feedback.objects.create(
            queue=queue,
            trajectory=recorded.trajectory,
            step=recorded.step,
            token=record,
            key=f"fb-{day}",
            reward=0.5,
            comment=f"Ana on day {day}",
            corrected_action={"content": f"Better on day {day}"},
            created_at=start + timedelta(days=day),
        )

    calls_purge(now=timezone.now())

    run = Trajectory.objects.get()
    steps = list(run.steps.order_by("position"))
    kept = [s.position for s in steps if s.decision_point]
    assert kept == list(range(15, 45))  # the last 30 days' steps (day 14 is 30 days and more)
    for step in steps[:15]:
        assert (step.observation, step.action_text, step.continuation_hash) == ([], "", "")
    assert steps[44].action_text == "Noted on day 44."
    assert "Day 44" in json.dumps(steps[44].observation)
    feedback = {f.key: f for f in Feedback.objects.all()}
    assert sum(f.comment == "" and f.corrected_action == {} for f in feedback.values()) == 15
    assert feedback["fb-44"].comment == "Ana on day 44" and "fb-14" not in feedback
    assert Feedback.objects.filter(reward=0.5).count() == 45  # figures stay
    everything = json.dumps(
        [
            list(Trajectory.objects.values("goal")),
            list(Step.objects.filter(position__lt=15).values()),
            list(Feedback.objects.filter(step__position__lt=15).values()),
        ],
        default=str,
    )
    for day in range(15):
        assert f"ana{day}@example.com" not in everything and f"day {day}" not in everything
    # The run goes on under its key, from where it was.
    assert (run.purged_at, run.key, run.step_count) == (None, "daily", 45)
    follow = agent_step(
        queue,
        [*messages, {"role": "user", "content": "Day 45"}],
        key="daily",
        text="Noted.",
        token=record,
        end_user="ana-42",
    )
    assert follow.trajectory == run
    assert [m["content"] for m in follow.step.observation] == ["Day 45"]
