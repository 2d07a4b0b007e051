"""Agent runs exported as training data: the canonical record, OpenAI's fine-tuning format
(checked with the `openai` package's types and OpenAI's rules), TRL's conversational format
with tools (loaded by Hugging Face `datasets`, the loader TRL's trainers take), step
preference pairs; and each exporter gets only the queues they may export."""

import json
from pathlib import Path
from typing import Any

import datasets
import pytest
from django.core.management import call_command
from django.test import Client

from icrlhf.export.models import ExportRun
from icrlhf.export.trajectories import (
    TrajectoryFilters,
    canonical_trajectories,
    trajectories_filtered,
    trajectory_derive,
)
from icrlhf.gateway.models import Call
from icrlhf.ingest.services import token_create
from icrlhf.queues.models import Queue
from icrlhf.trajectories.feedback import feedback_record
from icrlhf.trajectories.models import Trajectory
from tests.factories import QueueFactory, UserFactory, agent_step, member_add
from tests.support.openai_finetune import finetune_line_problems

pytestmark = pytest.mark.django_db

LOOKUP_TOOL = {
    "type": "function",
    "function": {
        "name": "lookup_order",
        "description": "Find an order.",
        "parameters": {
            "type": "object",
            "properties": {"order_id": {"type": "string"}},
            "required": ["order_id"],
        },
    },
}
REFUND_TOOL = {
    "type": "function",
    "function": {
        "name": "refund",
        "description": "Refund an order.",
        "parameters": {
            "type": "object",
            "properties": {"order_id": {"type": "string"}, "amount": {"type": "number"}},
            "required": ["order_id", "amount"],
        },
    },
}
SYSTEM = {"role": "system", "content": "You are the support desk."}


def _call(name: str, call_id: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


def agent_run(queue: Queue, order: str, *, success: bool | None = True) -> Trajectory:
    """A support agent's run through the gateway: look the order up, refund it, say so."""
    goal = {"role": "user", "content": f"Order {order} arrived broken."}
    lookup = _call("lookup_order", f"call_{order}_1", {"order_id": order})
    refund = _call("refund", f"call_{order}_2", {"order_id": order, "amount": 20})
    looked = {"role": "tool", "tool_call_id": lookup["id"], "content": '{"state": "damaged"}'}
    refunded = {"role": "tool", "tool_call_id": refund["id"], "content": '{"ok": true}'}
    turns: list[tuple[list[dict[str, Any]], str, list[dict[str, Any]]]] = [
        ([goal], "", [lookup]),
        ([goal, {"role": "assistant", "tool_calls": [lookup]}, looked], "", [refund]),
        (
            [
                goal,
                {"role": "assistant", "tool_calls": [lookup]},
                looked,
                {"role": "assistant", "tool_calls": [refund]},
                refunded,
            ],
            "Refunded 20 EUR.",
            [],
        ),
    ]
    key = f"run-{order}"
    for messages, text, calls in turns:
        call = Call.objects.create(
            queue=queue,
            source="model",
            memory="empty",
            request_text=str(messages[-1]["content"] or ""),
            context=[SYSTEM, *messages],
            options={"tools": [LOOKUP_TOOL, REFUND_TOOL]},
            answer_text=text,
            tool_calls=calls,
        )
        recorded = agent_step(
            queue, [SYSTEM, *messages], key=key, text=text, tool_calls=calls, call_id=call.pk
        )
    if success is not None:
        feedback_record(
            queue=queue,
            token=None,
            call_id=None,
            trajectory_ref=key,
            reward=1.0 if success else 0.0,
            success=success,
        )
    return recorded.trajectory


def lines(fmt: str, **filters: Any) -> list[dict[str, Any]]:
    records = canonical_trajectories(trajectories_filtered(TrajectoryFilters(**filters)))
    return [line for record in records for line in trajectory_derive(record, fmt)]


def test_the_canonical_record_is_the_whole_run_with_its_rewards_and_feedback() -> None:
    queue = QueueFactory()
    run = agent_run(queue, "4821")
    [record] = lines("canonical")
    assert record["trajectory_id"] == str(run.pk) and record["key"] == "run-4821"
    assert (record["outcome"], record["reward"]) == ("succeeded", 1.0)
    assert record["goal"] == "Order 4821 arrived broken."
    assert record["system"] == [SYSTEM] and record["tools"] == [LOOKUP_TOOL, REFUND_TOOL]
    steps = record["steps"]
    assert [s["position"] for s in steps] == [0, 1, 2]
    assert steps[0]["action"]["tool_calls"][0]["function"]["name"] == "lookup_order"
    assert steps[1]["observation"][-1]["content"] == '{"state": "damaged"}'
    assert steps[2]["action"] == {"content": "Refunded 20 EUR.", "tool_calls": []}
    [feedback] = record["feedback"]
    assert (feedback["reward"], feedback["success"], feedback["step_position"]) == (1.0, True, None)


def test_openai_lines_are_the_runs_that_succeeded_in_openais_fine_tuning_format() -> None:
    queue = QueueFactory()
    agent_run(queue, "4821")
    agent_run(queue, "5100", success=False)
    agent_run(queue, "6000", success=None)
    [line] = lines("openai")
    assert finetune_line_problems(line) == []
    roles = [m["role"] for m in line["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert "content" not in line["messages"][2]  # a tool call carries no null content
    assert line["messages"][-1]["content"] == "Refunded 20 EUR."
    # The checker refuses what OpenAI refuses: a call in the middle left unanswered (the
    # last message's calls need no answer: they are what the model learns to make).
    ending_in_a_call = {**line, "messages": line["messages"][:3]}
    assert finetune_line_problems(ending_in_a_call) == []
    unanswered = {**line, "messages": [*line["messages"][:3], line["messages"][-1]]}
    assert finetune_line_problems(unanswered) == ["tool calls never answered: ['call_4821_1']"]


def test_trl_lines_load_with_datasets_with_arguments_as_objects(tmp_path: Path) -> None:
    queue = QueueFactory()
    agent_run(queue, "4821")
    agent_run(queue, "4822")
    path = tmp_path / "trl.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines("trl")))
    loaded = datasets.load_dataset("json", data_files=str(path), split="train")
    assert loaded.num_rows == 2 and set(loaded.column_names) == {"messages", "tools"}
    messages = loaded[0]["messages"]
    assert messages[2]["tool_calls"][0]["function"]["arguments"]["order_id"] == "4821"
    assert (messages[3]["role"], messages[3]["name"]) == ("tool", "lookup_order")
    assert loaded[1]["tools"][1]["function"]["name"] == "refund"


def test_a_corrected_step_is_a_preference_pair_at_that_decision_point(tmp_path: Path) -> None:
    queue = QueueFactory()
    run = agent_run(queue, "4821", success=None)
    refund_step = run.steps.get(position=1)
    corrected = {"tool_calls": [_call("escalate", "fix_1", {"order_id": "4821"})]}
    feedback_record(
        queue=queue,
        token=None,
        call_id=refund_step.call_id,
        trajectory_ref=None,
        reward=0.0,
        success=None,
        corrected_action=corrected,
    )
    [pair] = lines("pairs")
    assert pair["prompt"][0] == SYSTEM and pair["prompt"][-1]["role"] == "tool"
    assert pair["chosen"][0]["tool_calls"][0]["function"] == {
        "name": "escalate",
        "arguments": {"order_id": "4821"},
    }
    assert pair["rejected"][0]["tool_calls"][0]["function"]["name"] == "refund"
    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps(pair) + "\n")
    loaded = datasets.load_dataset("json", data_files=str(path), split="train")
    assert {"prompt", "chosen", "rejected", "tools"} <= set(loaded.column_names)


def test_the_command_writes_a_file_and_the_export_is_recorded(tmp_path: Path) -> None:
    queue = QueueFactory()
    agent_run(queue, "4821")
    agent_run(queue, "5100", success=False)
    out = tmp_path / "runs.jsonl"
    call_command("export_trajectories", "--outcome", "failed", "--out", str(out))
    [record] = [json.loads(line) for line in out.read_text().splitlines()]
    assert record["outcome"] == "failed"
    run = ExportRun.objects.get()
    assert (run.format, run.records, run.consumer) == ("trajectory:canonical", 1, "command")


@pytest.mark.parametrize("role", ["viewer", "reviewer", "curator", "admin"])
def test_each_role_downloads_only_the_runs_of_queues_it_curates(role: str) -> None:
    mine, theirs = QueueFactory(), QueueFactory()
    own, foreign = agent_run(mine, "4821"), agent_run(theirs, "9999")
    person = UserFactory(groups=["admin"] if role == "admin" else [])
    if role != "admin":
        member_add(mine, person, role)
    client = Client()
    client.force_login(person)
    form = {"format": "canonical", "queue": "", "outcome": ""}
    if role in ("viewer", "reviewer"):
        assert client.get("/export/trajectories/").status_code == 403
        assert client.post("/export/trajectories/", form).status_code == 403
        return
    response = client.post("/export/trajectories/", form)
    assert response.status_code == 200
    assert response["Content-Disposition"].startswith(
        'attachment; filename="icrlhf-trajectories-canonical-'
    )
    content = b"".join(response.streaming_content).decode()  # type: ignore[attr-defined]
    exported = {json.loads(line)["trajectory_id"] for line in content.splitlines()}
    if role == "curator":
        assert exported == {str(own.pk)}
        # Naming the other queue is refused with a message, and nothing is downloaded.
        refused = client.post("/export/trajectories/", {**form, "queue": theirs.pk})
        assert refused.status_code == 400 and b"Select a valid choice" in refused.content
    else:
        assert exported == {str(own.pk), str(foreign.pk)}


def test_the_api_exports_the_tokens_queue_only() -> None:
    mine, theirs = QueueFactory(), QueueFactory()
    agent_run(mine, "4821")
    agent_run(theirs, "9999")
    _, token = token_create(queue=mine, name="trainer", scopes=["export"])
    client = Client()
    auth = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    response = client.get("/api/v1/exports/trajectories?format=openai", **auth)
    assert response.status_code == 200
    content = b"".join(response.streaming_content).decode()  # type: ignore[attr-defined]
    [line] = [json.loads(text) for text in content.splitlines()]
    assert "Order 4821" in line["messages"][1]["content"]
    assert client.get("/api/v1/exports/trajectories").status_code == 401
    bad = client.get("/api/v1/exports/trajectories?format=xml", **auth)
    assert bad.status_code == 422
    # A token without the export scope exports nothing.
    _, ingest_only = token_create(queue=mine, name="agent")
    refused = client.get("/api/v1/exports/trajectories", HTTP_AUTHORIZATION=f"Bearer {ingest_only}")
    assert refused.status_code in (401, 403)


def test_runs_a_training_format_cannot_carry_are_left_out_of_it_not_of_canonical() -> None:
    queue = QueueFactory()
    purged = agent_run(queue, "4821")
    Trajectory.objects.filter(pk=purged.pk).update(goal="")  # what retention leaves
    garbled = agent_run(queue, "5000")
    step = garbled.steps.get(position=0)
    step.tool_calls = [
        {**step.tool_calls[0], "function": {"name": "lookup_order", "arguments": "{oops"}}
    ]
    step.save()
    kept = agent_run(queue, "6000")
    assert len(lines("canonical")) == 3
    for fmt in ("openai", "trl"):
        exported = lines(fmt)
        assert len(exported) == 1 and "Order 6000" in json.dumps(exported[0]), fmt
    assert kept.pk


def test_the_tools_are_every_tool_the_runs_calls_offered() -> None:
    queue = QueueFactory()
    run = agent_run(queue, "4821")
    first = run.steps.get(position=0).call
    assert first is not None
    Call.objects.filter(pk=first.pk).update(options={"tools": [LOOKUP_TOOL]})
    for later in run.steps.exclude(position=0):
        assert later.call is not None
        Call.objects.filter(pk=later.call.pk).update(options={"tools": [REFUND_TOOL]})
    [line] = lines("openai")
    assert line["tools"] == [LOOKUP_TOOL, REFUND_TOOL]
    assert finetune_line_problems(line) == []
