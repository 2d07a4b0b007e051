"""A run's page states one outcome, one reward and what memory keeps, each with where it came
from (the application's token, a named reviewer, a curator in the admin), from one selector
(run_summary), and stays consistent after every action: the application's feedback, a
person's outcome, approve, decline."""

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from icrlhf.ingest.models import IntegrationToken
from icrlhf.ingest.services import token_create
from icrlhf.memory.models import Example
from icrlhf.queues.models import Queue
from icrlhf.trajectories.feedback import feedback_record
from icrlhf.trajectories.models import Trajectory
from icrlhf.trajectories.selectors import Memory, Said, Source, Stored, run_summary
from tests.factories import QueueFactory, UserFactory, agent_step, member_add

pytestmark = pytest.mark.django_db

GOAL = {"role": "user", "content": "My order 4821 arrived broken."}
LOOKUP = {
    "id": "call_7",
    "type": "function",
    "function": {"name": "lookup_order", "arguments": '{"order_id": "4821"}'},
}
RESULT = {"role": "tool", "tool_call_id": "call_7", "content": '{"condition": "damaged"}'}


def _run(queue: Queue, token: IntegrationToken, key: str = "order-4821") -> Trajectory:
    agent_step(
        queue, [GOAL], key=key, tool_calls=[LOOKUP], tool_names=["lookup_order"], token=token
    )
    turns = [GOAL, {"role": "assistant", "tool_calls": [LOOKUP]}, RESULT]
    recorded = agent_step(
        queue, turns, key=key, text="Refunded.", tool_names=["lookup_order"], token=token
    )
    return recorded.trajectory


def _app_says(queue: Queue, token: IntegrationToken, key: str = "order-4821", **said: Any) -> None:
    feedback_record(
        queue=queue,
        token=token,
        call_id=None,
        trajectory_ref=key,
        reward=said.get("reward"),
        success=said.get("success"),
        key=said.get("feedback_id", ""),
    )


def _setup(**queue_fields: Any) -> tuple[Queue, IntegrationToken, Trajectory, User, Client]:
    queue = QueueFactory(**queue_fields)
    token, _ = token_create(queue=queue, name="shop-bot")
    reviewer = UserFactory(username="bob")
    member_add(queue, reviewer, "reviewer")
    client = Client()
    client.force_login(reviewer)
    return queue, token, _run(queue, token), reviewer, client


def _summary(trajectory: Trajectory) -> Any:
    return run_summary(Trajectory.objects.get(pk=trajectory.pk))


def _page(client: Client, trajectory: Trajectory) -> str:
    response = client.get(f"/q/{trajectory.queue.slug}/trajectories/{trajectory.pk}/")
    assert response.status_code == 200
    return response.content.decode()


def _decide(client: Client, trajectory: Trajectory, decision: str) -> str:
    seen = {
        "seen_step": [str(pk) for pk in trajectory.steps.values_list("pk", flat=True)],
        "seen_feedback": [str(pk) for pk in trajectory.feedback.values_list("pk", flat=True)],
    }
    response = client.post(
        f"/q/{trajectory.queue.slug}/trajectories/{trajectory.pk}/approval",
        {"decision": decision, **seen},
        follow=True,
    )
    return response.content.decode()


def _as_app(said: Said | None) -> tuple[Source, str] | None:
    return None if said is None else (said.source, said.name)


def test_the_applications_feedback_is_the_runs_outcome_and_reward_named_by_its_token() -> None:
    queue, token, trajectory, _, client = _setup(reward_threshold=0.5)
    _app_says(queue, token, reward=0.9, success=True)

    summary = _summary(trajectory)
    assert summary.outcome == Trajectory.Outcome.SUCCEEDED
    assert _as_app(summary.outcome_said) == (Source.APPLICATION, "shop-bot")
    assert (summary.reward, summary.reward_from_outcome) == (0.9, False)
    assert _as_app(summary.reward_said) == (Source.APPLICATION, "shop-bot")
    assert summary.memory == Memory.STORED
    assert summary.stored == (Stored(role="preferred", reward=0.9, steps=2),)
    assert (summary.preferred, summary.rejected) == (2, 0)

    page = _page(client, trajectory)
    assert "Succeeded, said by the application (token “shop-bot”), " in page
    assert "0.90, from the application (token “shop-bot”)" in page
    assert "Stored as memory: 2 steps (2 preferred, reward 0.90)." in page
    assert page.count("reward 0.90") == 1 + 2  # the summary, and each step's example


def test_a_persons_outcome_is_named_and_its_reward_is_the_one_memory_learns() -> None:
    """The issue: after a person's Succeeded the page said "Succeeded, reward 0.00" (the
    application's earlier reward) and "The application rewarded this run"."""
    queue, token, trajectory, _, client = _setup(reward_threshold=0.5, rewards_need_approval=True)
    _app_says(queue, token, reward=0.0)
    response = client.post(
        f"/q/{queue.slug}/trajectories/{trajectory.pk}/outcome",
        {"outcome": "succeeded"},
        follow=True,
    )
    flash = response.content.decode()
    assert "Outcome set: succeeded. Memory: Nothing yet: awaiting approval." in flash

    summary = _summary(trajectory)
    assert summary.outcome == Trajectory.Outcome.SUCCEEDED
    assert _as_app(summary.outcome_said) == (Source.PERSON, "bob")
    assert (summary.reward, summary.reward_from_outcome) == (1.0, True)
    assert _as_app(summary.reward_said) == (Source.PERSON, "bob")
    assert summary.memory == Memory.PENDING and summary.stored == ()

    page = _page(client, trajectory)
    assert "Succeeded, said by bob (a reviewer), " in page
    assert "1.00: bob (a reviewer) said it succeeded (success counts as 1, failure as 0)" in page
    assert "reward 0.00" not in page and "The application rewarded this run" not in page
    assert (
        "Nothing yet: awaiting approval. Approved, 2 steps would be stored as preferred "
        "(reward 1.00, at or above the queue&#x27;s bar, 0.50)."
    ) in page


def test_a_run_awaiting_approval_says_nothing_is_in_memory_yet_and_what_approval_would_store() -> (
    None
):
    queue, token, trajectory, _, client = _setup(reward_threshold=0.5, rewards_need_approval=True)
    _app_says(queue, token, reward=0.2, success=False)

    summary = _summary(trajectory)
    assert summary.outcome == Trajectory.Outcome.FAILED
    assert summary.memory == Memory.PENDING and summary.role_for_reward == "rejected"
    page = _page(client, trajectory)
    assert "Failed, said by the application (token “shop-bot”), " in page
    assert "Nothing yet: awaiting approval. Approved, 2 steps would be stored as rejected" in page
    assert "Approve into memory" in page


def test_approving_says_what_it_stored_and_the_page_agrees() -> None:
    queue, token, trajectory, _, client = _setup(reward_threshold=0.5, rewards_need_approval=True)
    _app_says(queue, token, reward=0.9, success=True)

    page = _decide(client, trajectory, "approve")
    assert "Approved: 2 steps stored as memory (preferred, reward 0.90)." in page
    assert "Approved by bob, " in page
    assert "Stored as memory: 2 steps (2 preferred, reward 0.90)." in page
    assert "Approve into memory" not in page

    summary = _summary(trajectory)
    assert summary.memory == Memory.STORED and summary.approval == Trajectory.Approval.APPROVED
    assert summary.approved_by == "bob"
    assert summary.stored == (Stored(role="preferred", reward=0.9, steps=2),)


def test_approving_a_run_already_in_memory_says_nothing_was_stored_and_why() -> None:
    """The issue: "Approved: 0 step(s) stored as memory" beside steps marked "rejected
    example, reward 0.10" under "Succeeded, reward 0.90"."""
    queue, token, trajectory, _, client = _setup(reward_threshold=0.5)
    _app_says(queue, token, reward=0.1)  # no approval asked yet: stored as rejected
    queue.rewards_need_approval = True
    queue.save()
    _app_says(queue, token, reward=0.9, success=True)
    assert _summary(trajectory).memory == Memory.PENDING
    assert (
        "Awaiting approval; already in memory: 2 steps (2 rejected, reward 0.10). Approved, "
        "nothing new would be stored: a step keeps the first reward that reaches memory."
    ) in _page(client, trajectory)

    page = _decide(client, trajectory, "approve")
    assert (
        "Approved, but nothing was stored: every step was already in memory from earlier feedback."
    ) in page
    assert "Succeeded, said by the application (token “shop-bot”), " in page
    assert "0.90, from the application (token “shop-bot”)" in page
    assert (
        "Stored as memory: 2 steps (2 rejected, reward 0.10). A step keeps the first reward "
        "that reaches memory: reward 0.10 came from other feedback than the run&#x27;s latest "
        "(0.90)."
    ) in page

    summary = _summary(trajectory)
    assert summary.memory == Memory.STORED and summary.reward == 0.9
    assert summary.stored == (Stored(role="rejected", reward=0.1, steps=2),)
    assert (summary.preferred, summary.rejected) == (0, 2)


def test_declining_keeps_the_feedback_out_of_memory_and_the_page_says_who_declined() -> None:
    queue, token, trajectory, _, client = _setup(reward_threshold=0.5, rewards_need_approval=True)
    _app_says(queue, token, reward=0.9, success=True)

    page = _decide(client, trajectory, "decline")
    assert page.count("Declined by bob, ") == 2  # the message, and the page
    assert "its feedback was kept out of memory." in page
    summary = _summary(trajectory)
    assert summary.memory == Memory.DECLINED and summary.stored == ()
    assert summary.reward == 0.9 and not Example.objects.exists()


def test_without_a_reward_rule_the_page_says_nothing_reaches_memory_and_why() -> None:
    queue, token, trajectory, _, client = _setup(reward_threshold=None)
    _app_says(queue, token, reward=1.0, success=True)

    summary = _summary(trajectory)
    assert summary.memory == Memory.NO_RULE and summary.reward == 1.0
    page = _page(client, trajectory)
    assert "Nothing: this queue has no reward rule (its routing page sets one)" in page
    assert "1.00, from the application (token “shop-bot”)" in page


def test_approving_after_the_rule_was_removed_says_the_queue_has_no_reward_rule() -> None:
    queue, token, trajectory, _, client = _setup(reward_threshold=0.5, rewards_need_approval=True)
    _app_says(queue, token, reward=0.9)
    queue.reward_threshold = None
    queue.save()

    page = _decide(client, trajectory, "approve")
    assert "Approved, but nothing was stored: the queue has no reward rule." in page
    assert _summary(trajectory).memory == Memory.NO_RULE


def test_a_run_nobody_has_rewarded_says_so() -> None:
    _, _, trajectory, _, client = _setup(reward_threshold=0.5)
    summary = _summary(trajectory)
    assert (summary.outcome, summary.outcome_said, summary.reward) == ("", None, None)
    assert summary.memory == Memory.NO_REWARD
    page = _page(client, trajectory)
    assert "Not known yet: no feedback has said how it ended." in page
    assert "Nothing yet: no feedback has rewarded this run." in page


def test_a_curators_outcome_and_reward_in_the_admin_are_said_to_come_from_the_admin() -> None:
    _, _, trajectory, _, client = _setup(reward_threshold=0.5)
    Trajectory.objects.filter(pk=trajectory.pk).update(outcome="failed", reward=0.3)
    summary = _summary(trajectory)
    assert _as_app(summary.outcome_said) == (Source.ADMIN, "")
    assert (summary.reward, _as_app(summary.reward_said)) == (0.3, (Source.ADMIN, ""))
    page = _page(client, trajectory)
    assert "Failed, said by a curator in the admin." in page
    assert "0.30, from a curator in the admin." in page


def test_each_change_restates_one_outcome_and_one_reward_the_latest_feedbacks() -> None:
    queue, token, trajectory, _, client = _setup(reward_threshold=0.5)
    _app_says(queue, token, reward=0.9, success=True)
    client.post(f"/q/{queue.slug}/trajectories/{trajectory.pk}/outcome", {"outcome": "failed"})
    summary = _summary(trajectory)
    assert (summary.outcome, summary.reward) == ("failed", 0.0)
    assert _as_app(summary.outcome_said) == _as_app(summary.reward_said) == (Source.PERSON, "bob")
    # The list states the same reward as the page.
    listing = client.get(f"/q/{queue.slug}/trajectories/").content.decode()
    assert "<td>0.00</td>" in listing and "<td>0.90</td>" not in listing
    # The application again, a reward alone: the reward is its, the outcome stays the person's.
    _app_says(queue, token, reward=0.7, feedback_id="second")
    summary = _summary(trajectory)
    assert (summary.outcome, summary.reward) == ("failed", 0.7)
    assert _as_app(summary.outcome_said) == (Source.PERSON, "bob")
    assert _as_app(summary.reward_said) == (Source.APPLICATION, "shop-bot")
