"""Corrections teach: an application's `corrected_action` on a call becomes that step's
preferred example and the action the gateway served its rejected rival, with the feedback's
reward, under the queue's reward rule, approval and redaction; once per feedback; a later
correction of the step replaces the earlier one; and the next similar decision retrieves
the corrected action."""

import json
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from icrlhf.gateway.models import Call
from icrlhf.ingest.models import IntegrationToken
from icrlhf.ingest.services import token_create
from icrlhf.memory import index
from icrlhf.memory.models import CurationEvent, Example
from icrlhf.memory.selectors import examples_recall
from icrlhf.memory.signatures import Signature
from icrlhf.queues.models import Queue
from icrlhf.trajectories.models import Feedback, Step, Trajectory
from icrlhf.trajectories.rewards import RunSeen, rewards_approval_decide
from tests.factories import QueueFactory, UserFactory, agent_step, member_add

pytestmark = pytest.mark.django_db


def _tool(name: str, argument: str) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "parameters": {
                "type": "object",
                "properties": {argument: {"type": "string"}},
                "required": [argument],
            },
        },
    }


TOOLS = [_tool("lookup_order", "order_id"), _tool("refund", "order_id")]
TOOL_NAMES = ["lookup_order", "refund"]
GOAL = {"role": "user", "content": "My order 4821 arrived broken."}
LOOKUP = {
    "id": "call_7",
    "type": "function",
    "function": {"name": "lookup_order", "arguments": '{"order_id": "4821"}'},
}
LOOKUP_TURN = {"role": "assistant", "content": None, "tool_calls": [LOOKUP]}
RESULT = {"role": "tool", "tool_call_id": "call_7", "content": '{"condition": "damaged"}'}
REFUND = {"function": {"name": "refund", "arguments": '{"order_id": "4821"}'}}


def _run(queue: Queue, key: str, token: IntegrationToken | None = None) -> list[Step]:
    """Two steps, each its own gateway call offering the tools: a lookup, then prose where a
    refund was right."""
    steps = []
    conversation = [GOAL, LOOKUP_TURN, RESULT]
    for messages, text, calls in (([GOAL], "", [LOOKUP]), (conversation, "I am sorry.", [])):
        call = Call.objects.create(
            queue=queue, token=token, source="model", memory="used", options={"tools": TOOLS}
        )
        steps.append(
            agent_step(
                queue,
                messages,
                key=key,
                text=text,
                tool_calls=calls,
                tool_names=TOOL_NAMES,
                call_id=call.pk,
                token=token,
            ).step
        )
    return steps


def _post(token: str, body: dict[str, Any], **headers: str) -> Any:
    return Client().post(
        "/api/v1/feedback",
        json.dumps(body),
        content_type="application/json",
        headers={"Authorization": f"Bearer {token}", **headers},
    )


def _correct(step: Step, action: dict[str, Any], reward: float = 0.2) -> dict[str, Any]:
    return {"call_id": str(step.call_id), "reward": reward, "corrected_action": action}


def test_a_correction_on_a_call_is_the_steps_preferred_example_and_the_served_its_rival(
    settings: Any,
) -> None:
    settings.REDACTION = "captured"  # the log keeps what end users wrote; memory does not
    queue = QueueFactory(reward_threshold=0.5)
    alice, alice_token = token_create(queue=queue, name="app A")
    bob_token = token_create(queue=queue, name="app B")[1]
    _, reply = _run(queue, "run-1", token=alice)
    said = "Refunded; your receipt goes to ana.lopez@example.com."
    action = {"content": said, "tool_calls": [REFUND]}

    # Another token cannot correct this token's step: as if the call did not exist.
    refused = _post(bob_token, _correct(reply, action))
    assert refused.status_code == 404 and "Nothing was saved" in refused.json()["detail"]
    # A tool the call did not offer is refused, naming the field; nothing is saved.
    other_tool = {"tool_calls": [{"function": {"name": "delete_account", "arguments": "{}"}}]}
    wrong = _post(alice_token, _correct(reply, other_tool))
    assert wrong.status_code == 422, wrong.content
    assert "offered no tool “delete_account”" in wrong.json()["detail"]
    assert wrong.json()["errors"][0]["field"] == "corrected_action.tool_calls.0.function.name"
    not_object = {"tool_calls": [{"function": {"name": "refund", "arguments": "[1]"}}]}
    assert _post(alice_token, _correct(reply, not_object)).status_code == 422
    assert not Feedback.objects.exists() and not Example.objects.exists()

    key = {"Idempotency-Key": "fix-1"}
    first = _post(alice_token, _correct(reply, action), **key)
    assert first.status_code == 201, first.content
    preferred = Example.objects.get(role="preferred")
    rejected = Example.objects.get(role="rejected")
    assert (preferred.step_id, rejected.step_id) == (reply.pk, reply.pk)
    assert (preferred.reward, rejected.reward) == (1.0, 0.2)  # the feedback's reward
    assert preferred.tool_names == rejected.tool_names == TOOL_NAMES
    assert preferred.input_text == rejected.input_text == reply.decision_point
    # The turns before the decision point, then the corrected action (no result: unknown).
    corrected_turn = preferred.turns[-1]
    assert preferred.turns[:-1] == [GOAL, LOOKUP_TURN, RESULT]
    assert corrected_turn["tool_calls"][0]["function"] == REFUND["function"]
    assert corrected_turn["tool_calls"][0]["id"]  # the API leaves ids optional; turns need one
    # Redacted into memory as rewards are; the feedback keeps what the application sent.
    assert "ana.lopez@example.com" not in json.dumps([preferred.turns, preferred.output_text])
    assert "[email]" in corrected_turn["content"]
    assert Feedback.objects.get().corrected_action["content"] == said
    assert rejected.turns[-1] == {"role": "assistant", "content": "I am sorry."}

    # The same feedback key again: the first answer, nothing stored twice.
    again = _post(alice_token, _correct(reply, action), **key)
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
    assert Example.objects.count() == 2

    # A later correction of the step replaces the earlier one's examples (retired, audited).
    lookup_again = {"tool_calls": [{"function": LOOKUP["function"]}]}
    assert _post(alice_token, _correct(reply, lookup_again, reward=0.0)).status_code == 201
    live = Example.objects.exclude(status="retired")
    assert set(live.values_list("role", "reward")) == {("preferred", 1.0), ("rejected", 0.0)}
    assert live.get(role="preferred").output_text.startswith("lookup_order(")
    retired = Example.objects.filter(status="retired")
    assert set(retired.values_list("pk", flat=True)) == {preferred.pk, rejected.pk}
    assert all("correction" in e.retired_reason for e in retired)
    assert CurationEvent.objects.filter(action="retire").count() == 2
    # A reward on the whole run later: the corrected step keeps its correction.
    assert _post(alice_token, {"trajectory_id": "run-1", "reward": 1.0}).status_code == 201
    assert live.filter(step=reply).count() == 2
    assert Example.objects.filter(step__position=0, role="preferred").count() == 1


def test_without_a_reward_rule_a_correction_is_kept_on_the_feedback_only() -> None:
    queue = QueueFactory(reward_threshold=None)
    record, token = token_create(queue=queue, name="app")
    _, reply = _run(queue, "run", token=record)
    assert _post(token, _correct(reply, {"tool_calls": [REFUND]})).status_code == 201
    assert Feedback.objects.get().corrected_action["tool_calls"][0]["function"]["name"] == "refund"
    assert not Example.objects.exists()


def test_with_approval_a_correction_waits_and_the_latest_of_a_step_is_stored() -> None:
    queue = QueueFactory(reward_threshold=0.5, rewards_need_approval=True)
    reviewer = UserFactory()
    member_add(queue, reviewer, "reviewer")
    record, token = token_create(queue=queue, name="app")
    lookup, reply = _run(queue, "run", token=record)
    earlier = _correct(reply, {"content": "Sorry, order 4821 is lost."})
    assert _post(token, earlier).status_code == 201
    assert _post(token, _correct(reply, {"tool_calls": [REFUND]}, reward=0.1)).status_code == 201
    assert _post(token, {"trajectory_id": "run", "reward": 0.9}).status_code == 201
    trajectory = Trajectory.objects.get()
    assert trajectory.approval == "pending" and not Example.objects.exists()

    stored = rewards_approval_decide(
        queue=queue,
        trajectory_id=trajectory.pk,
        reviewer=reviewer,
        approve=True,
        seen=RunSeen.of(trajectory),
    )
    # The latest correction of the reply, its served action rejected with its reward; the
    # lookup from the run's reward. Nothing retired: the earlier correction never reached it.
    assert sorted((e.step_id, e.role, e.reward) for e in stored) == [
        (lookup.pk, "preferred", 0.9),
        (reply.pk, "preferred", 1.0),
        (reply.pk, "rejected", 0.1),
    ]
    assert Example.objects.get(step=reply, role="preferred").output_text.startswith("refund(")
    assert not Example.objects.filter(status="retired").exists()
    # Approved again after new feedback: the stored correction is not stored twice.
    assert _post(token, {"trajectory_id": "run", "reward": 0.8}).status_code == 201
    trajectory.refresh_from_db()
    rewards_approval_decide(
        queue=queue,
        trajectory_id=trajectory.pk,
        reviewer=reviewer,
        approve=True,
        seen=RunSeen.of(trajectory),
    )
    assert Example.objects.count() == 3


def test_after_a_correction_the_same_decision_point_retrieves_the_corrected_action(
    vector_store: Path,
) -> None:
    queue = QueueFactory(reward_threshold=0.5, min_similarity=0.0)
    record, token = token_create(queue=queue, name="app")
    _, reply = _run(queue, "run", token=record)
    signature = Signature(tool_names=frozenset(TOOL_NAMES), after_tool_result=True)

    def retrieved() -> list[str]:
        pending = Example.objects.filter(index_state="pending").values_list("pk", flat=True)
        index.examples_index(example_ids=list(pending))
        recall = examples_recall(
            queue=queue,
            query_text=reply.decision_point,
            k=1,
            token_budget=10_000,
            signature=signature,
        )
        return [r.example.output_text for r in recall.examples]

    # Rewarded as it was, the served prose is what memory offers at that point ...
    assert _post(token, {"trajectory_id": "run", "reward": 0.9}).status_code == 201
    assert retrieved() == ["I am sorry."]
    # ... corrected, the refund is.
    assert _post(token, _correct(reply, {"tool_calls": [REFUND]}, reward=0.0)).status_code == 201
    assert retrieved() == ['refund({"order_id": "4821"})']
