"""The feedback API: a reward and success on a call or a run, idempotent, for the token's own
queue only, with clear errors that save nothing."""

import json
import uuid
from typing import Any

import pytest
from django.test import Client

from icrlhf.gateway.models import Call
from icrlhf.ingest.models import IntegrationToken
from icrlhf.ingest.services import token_create
from icrlhf.queues.models import Queue
from icrlhf.trajectories.models import Feedback, Step, Trajectory
from tests.factories import QueueFactory, agent_step

pytestmark = pytest.mark.django_db


def _step(queue: Queue, *, key: str = "", token: IntegrationToken | None = None) -> Step:
    messages = [{"role": "user", "content": "Where is order 4821?"}]
    return agent_step(queue, messages, key=key, text="It ships Monday.", token=token).step


def _post(token: str, body: dict[str, Any], **headers: str) -> Any:
    return Client().post(
        "/api/v1/feedback",
        json.dumps(body),
        content_type="application/json",
        headers={"Authorization": f"Bearer {token}", **headers},
    )


def test_feedback_on_a_run_sets_its_reward_and_outcome_once_per_key() -> None:
    queue = QueueFactory()
    record, token = token_create(queue=queue, name="agent")
    step = _step(queue, key="run-7", token=record)
    body = {"trajectory_id": "run-7", "reward": 0.8, "success": True, "comment": "Solved."}
    first = _post(token, body, **{"Idempotency-Key": "fb-1"})
    assert first.status_code == 201, first.content
    assert first.json()["created"] is True and first.json()["step"] is None
    trajectory = Trajectory.objects.get()
    assert (trajectory.reward, trajectory.outcome) == (0.8, "succeeded")
    # The same key and body again return the first answer and change nothing.
    again = _post(token, body, **{"Idempotency-Key": "fb-1"})
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
    # The same key with another body is refused, naming what differs.
    other = _post(token, {**body, "reward": 0.1}, **{"Idempotency-Key": "fb-1"})
    assert other.status_code == 409 and "reward" in other.json()["detail"], other.content
    assert Trajectory.objects.get().reward == 0.8
    # Without a key, identical feedback is recorded once; by the trajectory's own id too.
    plain = {"trajectory_id": str(step.trajectory_id), "success": False}
    assert _post(token, plain).status_code == 201
    assert _post(token, plain).status_code == 200
    assert Feedback.objects.count() == 2
    assert Trajectory.objects.get().outcome == "failed"


def test_feedback_on_a_call_rewards_its_step_with_the_right_action() -> None:
    queue = QueueFactory()
    record, token = token_create(queue=queue, name="agent")
    step = _step(queue, token=record)
    call_id = uuid.uuid4()  # the id the gateway answered with (X-Icrlhf-Call)
    refund = {"type": "function", "function": {"name": "refund", "parameters": {}}}
    call = Call.objects.create(
        id=call_id,
        queue=queue,
        source="model",
        memory="used",
        request_text="Where?",
        options={"tools": [refund]},  # a correction may call only the tools offered
    )
    Step.objects.filter(pk=step.pk).update(call=call)
    corrected = {
        "tool_calls": [{"function": {"name": "refund", "arguments": '{"order_id": "4821"}'}}]
    }
    answer = _post(token, {"call_id": str(call_id), "reward": 0, "corrected_action": corrected})
    assert answer.status_code == 201, answer.content
    assert answer.json()["step"] == 0
    assert Step.objects.get().reward == 0
    stored = Feedback.objects.get()
    assert stored.corrected_action["tool_calls"][0]["function"]["name"] == "refund"
    assert Trajectory.objects.get().reward is None  # a step's reward is the step's


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"reward": 1}, "body"),  # no target
        ({"trajectory_id": "r", "call_id": str(uuid.uuid4()), "reward": 1}, "body"),
        ({"trajectory_id": "r"}, "body"),  # neither reward nor success
        ({"trajectory_id": "r", "reward": "lots"}, "reward"),
        ({"trajectory_id": "r", "reward": 1e300}, "reward"),
        ({"trajectory_id": "r", "reward": 1, "corrected_action": {}}, "corrected_action"),
        ({"trajectory_id": "  ", "reward": 1}, "body"),  # blank: names no run
        (
            {"trajectory_id": "r", "reward": 1, "corrected_action": {"content": "a\x00"}},
            "corrected_action.content",
        ),
    ],
)
def test_bad_feedback_is_refused_field_by_field_and_saves_nothing(
    body: dict[str, Any], field: str
) -> None:
    queue = QueueFactory()
    record, token = token_create(queue=queue, name="agent")
    _step(queue, key="r", token=record)
    answer = _post(token, body)
    assert answer.status_code == 422, answer.content
    assert any(e["field"].startswith(field) for e in answer.json()["errors"]), answer.json()
    assert not Feedback.objects.exists()


def test_a_token_reaches_only_its_own_queues_runs_and_needs_the_feedback_scope() -> None:
    mine, theirs = QueueFactory(), QueueFactory()
    _step(theirs, key="their-run")
    token = token_create(queue=mine, name="agent")[1]
    missing = _post(token, {"trajectory_id": "their-run", "reward": 1})
    assert missing.status_code == 404 and "Nothing was saved" in missing.json()["detail"]
    unscoped = token_create(queue=theirs, name="reader", scopes=["items"])[1]
    assert _post(unscoped, {"trajectory_id": "their-run", "reward": 1}).status_code == 403
    assert _post("not-a-token", {"trajectory_id": "their-run", "reward": 1}).status_code == 401
    assert not Feedback.objects.exists()


def test_an_idempotency_key_longer_than_kept_is_refused_not_cut() -> None:
    queue = QueueFactory()
    _step(queue, key="r")
    token = token_create(queue=queue, name="agent")[1]
    answer = _post(token, {"trajectory_id": "r", "reward": 1}, **{"Idempotency-Key": "k" * 201})
    assert answer.status_code == 422 and answer.json()["errors"][0]["field"] == "Idempotency-Key"
    assert not Feedback.objects.exists()


def test_another_tokens_run_call_and_feedback_key_are_out_of_reach() -> None:
    """The live probes, with two tokens of one queue: B cannot reward A's named run or A's
    call (404, as if they did not exist), and B's feedback under A's key is B's own."""
    queue = QueueFactory()
    alice, alice_token = token_create(queue=queue, name="app A")
    bob, bob_token = token_create(queue=queue, name="app B")
    alice_step = _step(queue, key="probe-run-42", token=alice)
    call = Call.objects.create(queue=queue, token=alice, source="model", memory="used")
    Step.objects.filter(pk=alice_step.pk).update(call=call)
    bob_step = _step(queue, key="bobs-run", token=bob)
    for body in (
        {"trajectory_id": "probe-run-42", "success": False},
        {"trajectory_id": str(alice_step.trajectory_id), "success": False},
        {"call_id": str(call.pk), "reward": 0},
    ):
        refused = _post(bob_token, body)
        assert refused.status_code == 404, (body, refused.content)
    assert not Feedback.objects.exists()
    assert Trajectory.objects.get(pk=alice_step.trajectory_id).outcome == ""
    # One feedback id, two tokens: two records, each on its own run with its own reward.
    key = {"Idempotency-Key": "probe-k1"}
    first = _post(alice_token, {"trajectory_id": "probe-run-42", "reward": 1.0}, **key)
    second = _post(bob_token, {"trajectory_id": "bobs-run", "reward": 0.2}, **key)
    assert (first.status_code, second.status_code) == (201, 201), second.content
    assert second.json()["trajectory_id"] == str(bob_step.trajectory_id)
    assert Trajectory.objects.get(pk=bob_step.trajectory_id).reward == 0.2
    assert Trajectory.objects.get(pk=alice_step.trajectory_id).reward == 1.0
