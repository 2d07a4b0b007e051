"""The queue's reward rule: feedback turns a run's steps into memory, preferred at or above
the threshold and rejected below it; and the next similar run gets them in its prompt."""

import json
from typing import Any

import openai
import pytest
from django.test import Client

from icrlhf.gateway.models import Call
from icrlhf.ingest.services import token_create
from icrlhf.memory.curation import examples_prune
from icrlhf.memory.models import Example
from icrlhf.queues.models import Queue
from icrlhf.trajectories.feedback import feedback_record
from icrlhf.trajectories.models import Trajectory
from icrlhf.trajectories.rewards import ApprovalConflict, RunSeen, rewards_approval_decide
from tests.factories import QueueFactory, UserFactory, agent_step, member_add
from tests.gateway.test_tools import ORDER_TOOL
from tests.support.fixed_latency_llm import FixedLatencyLLM
from tests.support.processes import GatewayProcess
from tests.support.waiting import wait_for

LOOKUP = {
    "id": "call_7",
    "type": "function",
    "function": {"name": "lookup_order", "arguments": '{"order_id": "4821"}'},
}
RESULT = {"role": "tool", "tool_call_id": "call_7", "content": '{"condition": "damaged"}'}
GOAL = {"role": "user", "content": "My order 4821 arrived broken."}
TOOL_NAMES = ["lookup_order", "refund"]


def _run(queue: Queue, key: str) -> Trajectory:
    first = [GOAL]
    second = [GOAL, {"role": "assistant", "tool_calls": [LOOKUP]}, RESULT]
    for messages, text, calls in ((first, "", [LOOKUP]), (second, "Refunded.", [])):
        recorded = agent_step(
            queue, messages, key=key, text=text, tool_calls=calls, tool_names=TOOL_NAMES
        )
    return recorded.trajectory


def _feedback(queue: Queue, key: str, **fields: Any) -> None:
    feedback_record(
        queue=queue,
        token=None,
        call_id=None,
        trajectory_ref=key,
        reward=fields.get("reward"),
        success=fields.get("success"),
    )


@pytest.mark.django_db
def test_a_rewarded_run_becomes_step_examples_as_the_rule_says() -> None:
    queue = QueueFactory(reward_threshold=0.5)
    trajectory = _run(queue, "good")
    _feedback(queue, "good", reward=0.9)
    lookup, reply = (
        Example.objects.get(step__trajectory=trajectory, step__position=p) for p in (0, 1)
    )
    assert (lookup.role, lookup.reward, lookup.decision) == ("preferred", 0.9, None)
    assert lookup.tool_names == ["lookup_order", "refund"]
    # The step as turns: the goal, the call, and the result it got (the next step saw it).
    assert lookup.turns == [
        GOAL,
        {"role": "assistant", "content": None, "tool_calls": [LOOKUP]},
        RESULT,
    ]
    assert lookup.input_text == GOAL["content"]
    assert reply.turns[-1] == {"role": "assistant", "content": "Refunded."}
    # Posted again (another key), the first reward that reached memory stands.
    feedback_record(
        queue=queue,
        token=None,
        call_id=None,
        trajectory_ref="good",
        reward=0.1,
        success=None,
        key="again",
    )
    assert Example.objects.filter(queue=queue).count() == 2

    _run(queue, "bad")
    _feedback(queue, "bad", success=False)  # failure counts as 0: below the bar
    assert set(
        Example.objects.filter(step__trajectory__key="bad").values_list("role", "reward")
    ) == {("rejected", 0.0)}


@pytest.mark.django_db
def test_without_a_rule_feedback_is_kept_but_never_reaches_memory() -> None:
    queue = QueueFactory(reward_threshold=None)
    _run(queue, "run")
    _feedback(queue, "run", reward=1.0, success=True)
    assert Trajectory.objects.get().outcome == "succeeded"
    assert not Example.objects.exists()


@pytest.mark.django_db
def test_with_approval_a_rewarded_run_waits_for_a_reviewer_then_reaches_memory_once() -> None:
    queue = QueueFactory(reward_threshold=0.5, rewards_need_approval=True)
    reviewer = UserFactory()
    member_add(queue, reviewer, "reviewer")
    trajectory = _run(queue, "good")
    _feedback(queue, "good", reward=0.9, success=True)
    trajectory.refresh_from_db()
    assert trajectory.approval == "pending" and trajectory.outcome == "succeeded"
    assert not Example.objects.exists()  # nothing before a person approved

    stored = rewards_approval_decide(
        queue=queue,
        trajectory_id=trajectory.pk,
        reviewer=reviewer,
        approve=True,
        seen=RunSeen.of(trajectory),
    )
    assert {(e.role, e.reward) for e in stored} == {("preferred", 0.9)} and len(stored) == 2
    trajectory.refresh_from_db()
    assert (trajectory.approval, trajectory.approved_by) == ("approved", reviewer)
    with pytest.raises(ApprovalConflict):  # decided once
        rewards_approval_decide(
            queue=queue,
            trajectory_id=trajectory.pk,
            reviewer=reviewer,
            approve=False,
            seen=RunSeen.of(trajectory),
        )

    declined = _run(queue, "doubtful")
    _feedback(queue, "doubtful", reward=1.0)
    rewards_approval_decide(
        queue=queue,
        trajectory_id=declined.pk,
        reviewer=reviewer,
        approve=False,
        seen=RunSeen.of(declined),
    )
    declined.refresh_from_db()
    assert declined.approval == "declined"
    assert not Example.objects.filter(step__trajectory=declined).exists()


@pytest.mark.django_db
@pytest.mark.parametrize("role", ["viewer", "reviewer", "curator", "stranger"])
def test_the_approval_buttons_work_for_reviewers_and_curators_only(role: str) -> None:
    queue = QueueFactory(reward_threshold=0.5, rewards_need_approval=True)
    person = UserFactory()
    if role != "stranger":
        member_add(queue, person, role)
    trajectory = _run(queue, "good")
    _feedback(queue, "good", reward=0.9)
    client = Client()
    client.force_login(person)
    url = f"/q/{queue.slug}/trajectories/{trajectory.pk}/approval"
    page = client.get(f"/q/{queue.slug}/trajectories/{trajectory.pk}/")
    seen = {
        "seen_step": [str(pk) for pk in trajectory.steps.values_list("pk", flat=True)],
        "seen_feedback": [str(pk) for pk in trajectory.feedback.values_list("pk", flat=True)],
    }
    response = client.post(url, {"decision": "approve", **seen}, follow=True)
    if role in ("viewer", "stranger"):
        assert page.status_code in (403, 404) and response.status_code in (403, 404)
        assert not Example.objects.exists()
        return
    assert b"Approve into memory" in page.content
    assert b"Approved: 2 steps stored as memory (preferred, reward 0.90)." in response.content
    assert Example.objects.filter(queue=queue).count() == 2
    again = client.post(url, {"decision": "decline", **seen}, follow=True)
    assert b"not awaiting approval" in again.content
    assert b"Choose Approve" in client.post(url, {"decision": "maybe"}, follow=True).content
    # A GET changes nothing; CSRF is enforced on the form.
    assert client.get(url).status_code == 405
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(person)
    assert strict.post(url, {"decision": "approve"}).status_code == 403


@pytest.mark.django_db
def test_a_pending_run_changes_nothing_and_approval_is_of_what_the_reviewer_saw() -> None:
    """Under approval, five failing runs prompted with an example neither credit nor prune
    it until a person approves; and a run that gained a step after the reviewer opened its
    page is refused with a sentence, storing nothing."""
    queue = QueueFactory(
        reward_threshold=0.5,
        rewards_need_approval=True,
        prune_min_retrievals=5,
        prune_max_utility=0.3,
    )
    reviewer = UserFactory()
    member_add(queue, reviewer, "reviewer")
    good = _run(queue, "good")
    _feedback(queue, "good", reward=1.0)
    rewards_approval_decide(
        queue=queue, trajectory_id=good.pk, reviewer=reviewer, approve=True, seen=RunSeen.of(good)
    )
    lookup = Example.objects.get(step__trajectory=good, step__position=0)
    failing = []
    for number in range(5):
        call = Call.objects.create(
            queue=queue,
            source="model",
            memory="used",
            request_text="x",
            examples=[{"id": str(lookup.pk), "score": 0.9}],
        )
        failing.append(
            agent_step(
                queue,
                [{"role": "user", "content": f"Order {number} broke."}],
                key=f"later-{number}",
                text="Sorry.",
                call_id=call.pk,
            ).trajectory
        )
        _feedback(queue, f"later-{number}", success=False)
    lookup.refresh_from_db()
    assert (lookup.times_retrieved, lookup.times_accepted) == (0, 0)
    assert examples_prune(queue=queue) == 0
    assert Trajectory.objects.filter(approval="pending").count() == 5

    run = failing[0]
    seen = RunSeen.of(run)
    agent_step(queue, [{"role": "user", "content": "And one more thing."}], key="later-0")
    with pytest.raises(ApprovalConflict, match="1 new step"):
        rewards_approval_decide(
            queue=queue, trajectory_id=run.pk, reviewer=reviewer, approve=True, seen=seen
        )
    assert not Example.objects.filter(step__trajectory=run).exists()
    # Approved as now seen, the run's reward credits the example it was prompted with.
    rewards_approval_decide(
        queue=queue, trajectory_id=run.pk, reviewer=reviewer, approve=True, seen=RunSeen.of(run)
    )
    lookup.refresh_from_db()
    assert (lookup.times_retrieved, lookup.times_accepted) == (1, 0)


@pytest.mark.django_db
def test_step_examples_retrieved_into_failing_runs_lose_utility_and_are_pruned() -> None:
    queue = QueueFactory(reward_threshold=0.5, prune_min_retrievals=3, prune_max_utility=0.3)
    good = _run(queue, "good")
    _feedback(queue, "good", reward=1.0)
    lookup = Example.objects.get(step__trajectory=good, step__position=0)
    for number in range(3):  # later runs prompted with it, which the application failed
        call = Call.objects.create(
            queue=queue,
            source="model",
            memory="used",
            request_text="x",
            examples=[{"id": str(lookup.pk), "score": 0.9}],
        )
        agent_step(
            queue,
            [{"role": "user", "content": f"Order {number} broke."}],
            key=f"later-{number}",
            text="Sorry.",
            call_id=call.pk,
        )
        _feedback(queue, f"later-{number}", success=False)
        _feedback(queue, f"later-{number}", reward=0.1)  # more feedback: credited once
    lookup.refresh_from_db()
    assert (lookup.times_retrieved, lookup.times_accepted) == (3, 0)
    assert lookup.utility == pytest.approx(1 / 5)
    assert examples_prune(queue=queue) == 1
    lookup.refresh_from_db()
    assert lookup.status == Example.Status.RETIRED
    # The run's page says where its steps stand in memory.
    reviewer = UserFactory()
    member_add(queue, reviewer, "reviewer")
    client = Client()
    client.force_login(reviewer)
    page = client.get(f"/q/{queue.slug}/trajectories/{good.pk}/").content.decode()
    assert "In memory: preferred example, retired, reward 1.00; retrieved 3 times" in page


@pytest.mark.django_db
def test_a_format_example_in_a_failing_runs_prompt_is_neither_credited_nor_blamed() -> None:
    """Another tool set's call, shown for the form of a call, says nothing of this run's
    choice: pruning must not read the run's failure against it."""
    queue = QueueFactory(reward_threshold=0.5)
    good = _run(queue, "good")
    _feedback(queue, "good", reward=1.0)
    lookup = Example.objects.get(step__trajectory=good, step__position=0)
    call = Call.objects.create(
        queue=queue,
        source="model",
        memory="empty",
        request_text="x",
        examples=[{"id": str(lookup.pk), "score": 0.2, "format": True}],
    )
    agent_step(queue, [GOAL], key="later", text="Sorry.", call_id=call.pk)
    _feedback(queue, "later", reward=0.0)
    lookup.refresh_from_db()
    assert (lookup.times_retrieved, lookup.utility) == (0, Example().utility)


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_feedback_on_a_run_reaches_the_next_similar_runs_prompt_at_that_step(
    gateway_process: GatewayProcess, fixed_llm: FixedLatencyLLM
) -> None:
    """Through the real gateway and worker: a run's tool call and its result, rewarded by
    the application, are in the prompt of the next run's same decision point."""
    queue = QueueFactory(reward_threshold=0.5, memory_candidates=0, capture_percent=0)
    token = token_create(queue=queue, name="app")[1]  # its calls' runs are its own to reward
    client = openai.OpenAI(base_url=gateway_process.base_url, api_key=token, max_retries=0)
    question = "Where is order 1234?"
    messages: list[dict[str, Any]] = [{"role": "user", "content": question}]
    first = client.chat.completions.create(
        model=queue.slug,
        messages=messages,
        tools=[ORDER_TOOL],
        extra_headers={"X-Icrlhf-Trajectory": "run-a"},
    )
    (call,) = first.choices[0].message.tool_calls or []
    messages += [
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "Shipped on Monday."},
    ]
    client.chat.completions.create(
        model=queue.slug,
        messages=messages,
        tools=[ORDER_TOOL],
        extra_headers={"X-Icrlhf-Trajectory": "run-a"},
    )
    wait_for(
        lambda: Trajectory.objects.filter(queue=queue, step_count=2).exists(),
        what="the run's two steps",
    )
    posted = Client().post(
        "/api/v1/feedback",
        json.dumps({"trajectory_id": "run-a", "reward": 1.0, "success": True}),
        content_type="application/json",
        headers={"Authorization": f"Bearer {token}"},
    )
    assert posted.status_code == 201, posted.content
    wait_for(
        lambda: (
            Example.objects.filter(queue=queue, index_state=Example.IndexState.INDEXED).count() == 2
        ),
        what="the rewarded steps indexed",
    )

    client.chat.completions.create(
        model=queue.slug,
        messages=[{"role": "user", "content": "Where is order 1299?"}],
        tools=[ORDER_TOOL],
    )
    sent = fixed_llm.last_request["messages"]
    example_id = f"example1_{call.id}"
    assert {"role": "user", "content": question} in sent
    assert any(m.get("tool_calls") and m["tool_calls"][0]["id"] == example_id for m in sent), sent
    assert {"role": "tool", "tool_call_id": example_id, "content": "Shipped on Monday."} in sent
    assert sent[-1] == {"role": "user", "content": "Where is order 1299?"}
