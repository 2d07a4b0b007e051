"""Grouping calls into trajectories: by the caller's id, or because a call's messages continue
an earlier call's conversation and answer."""

import json
import uuid
from typing import Any

import pytest
from django.utils import timezone

from icrlhf.queues.models import Queue
from icrlhf.trajectories.models import Trajectory
from icrlhf.trajectories.services import StepRecorded, step_record
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
        key="",
        messages=[GOAL],
        raw_messages=[GOAL],
        decision_point=GOAL["content"],
        action_text="Write to [EMAIL].",  # as stored
        raw_action_text=said,  # as the caller got it
        tool_calls=[],
        tool_names=[],
        call_id=None,
        created_at=timezone.now(),
    )
    thanks = {"role": "user", "content": "Thanks"}
    follow = _record(queue, [GOAL, {"role": "assistant", "content": said}, thanks])
    assert follow.trajectory == first.trajectory


def test_the_call_logs_retention_blanks_what_runs_hold(settings: Any) -> None:
    from datetime import timedelta

    from icrlhf.gateway.retention import calls_purge
    from icrlhf.trajectories.models import Feedback

    queue = QueueFactory()
    recorded = _record(queue, [SYSTEM, GOAL], tool_calls=[LOOKUP], key="old")
    Feedback.objects.create(
        queue=queue, trajectory=recorded.trajectory, key="k", reward=1, comment="Ana's order"
    )
    settings.CALL_RETENTION_DAYS = 30
    calls_purge(now=timezone.now() + timedelta(days=31))
    trajectory = Trajectory.objects.get()
    step = trajectory.steps.get()
    assert (trajectory.goal, step.decision_point, step.observation, step.tool_calls) == (
        "",
        "",
        [],
        [],
    )
    assert Feedback.objects.get().comment == "" and trajectory.step_count == 1


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
