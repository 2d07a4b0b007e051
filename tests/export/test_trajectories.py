"""Agent runs exported as training data: the canonical record, OpenAI's fine-tuning format
(checked with the `openai` package's types and OpenAI's rules), TRL's conversational format
with tools (loaded by Hugging Face `datasets`, the loader TRL's trainers take), step
preference pairs; each exporter gets only the queues they may export; and an anonymised
export holds no one's identity and no end user's personal data."""

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
import pytest
from django.core.management import call_command
from django.test import Client
from django.utils import timezone

from icrlhf.export.models import ExportRun
from icrlhf.export.trajectories import (
    TRAJECTORY_FORMATS,
    TrajectoryFilters,
    canonical_trajectories,
    trajectories_filtered,
    trajectory_derive,
    trajectory_export_lines,
)
from icrlhf.gateway.models import Call
from icrlhf.ingest.services import token_create
from icrlhf.queues.models import Queue
from icrlhf.trajectories.feedback import feedback_record
from icrlhf.trajectories.models import Feedback, Step, Trajectory
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
ESCALATE_TOOL = {
    "type": "function",
    "function": {
        "name": "escalate",
        "description": "Hand the order to a person.",
        "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}},
    },
}
TOOLS = [LOOKUP_TOOL, REFUND_TOOL, ESCALATE_TOOL]
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
            options={"tools": TOOLS},
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
    chosen = TrajectoryFilters(**filters)
    records = canonical_trajectories(trajectories_filtered(chosen), anonymize=chosen.anonymize)
    return [line for record in records for line in trajectory_derive(record, fmt)]


def test_the_canonical_record_is_the_whole_run_with_its_rewards_and_feedback() -> None:
    queue = QueueFactory()
    run = agent_run(queue, "4821")
    [record] = lines("canonical")
    assert record["trajectory_id"] == str(run.pk) and record["key"] == "run-4821"
    assert (record["outcome"], record["reward"]) == ("succeeded", 1.0)
    assert record["goal"] == "Order 4821 arrived broken."
    assert record["system"] == [SYSTEM] and record["tools"] == TOOLS
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


EMAIL, CARD, KEY = "jane.doe@example.com", "4111 1111 1111 1111", "user-jane-42"


@dataclass
class PersonalRun:
    trajectory: Trajectory
    # Who approved it, the token its calls and feedback came through, the calls' end user.
    identities: list[str]


def personal_run(queue: Queue) -> PersonalRun:
    """A run named by the application after its end user, whose every text holds her e-mail
    address and card number (the goal, the system message, tool calls' arguments and results,
    the final answer, the feedback's comment and corrected action), its calls and feedback
    through a token, approved by a reviewer."""
    contact = {"email": EMAIL, "card": CARD}
    system = {"role": "system", "content": f"You are the support desk. The customer: {EMAIL}."}
    goal = {
        "role": "user",
        "name": "jane_doe",
        "content": f"I am {EMAIL}; order 4821 arrived broken, refund my card {CARD}.",
    }
    lookup = _call("lookup_order", "call_1", {"order_id": "4821", **contact})
    # As models often write arguments: compact JSON.
    refund = _call("refund", "call_2", {})
    refund["function"]["arguments"] = json.dumps(
        {"order_id": "4821", "amount": 20, **contact}, separators=(",", ":")
    )
    looked = {"role": "tool", "tool_call_id": "call_1", "content": json.dumps(contact)}
    refunded = {"role": "tool", "tool_call_id": "call_2", "content": '{"ok":true}'}
    token, plain = token_create(queue=queue, name="Jane's helpdesk")
    end_user = "end-user-jane"  # the calls' `user`
    first = [goal, {"role": "assistant", "tool_calls": [lookup]}, looked]
    turns: list[tuple[list[dict[str, Any]], str, list[dict[str, Any]]]] = [
        ([goal], "", [lookup]),
        (first, "", [refund]),
        (
            [*first, {"role": "assistant", "tool_calls": [refund]}, refunded],
            f"Refunded 20 EUR to {CARD}; the receipt went to {EMAIL}.",
            [],
        ),
    ]
    for messages, text, calls in turns:
        call = Call.objects.create(
            queue=queue,
            token=token,
            source="model",
            memory="empty",
            request_text=str(messages[-1]["content"] or ""),
            context=[system, *messages],
            options={"tools": TOOLS, "user": end_user},
            answer_text=text,
            tool_calls=calls,
        )
        recorded = agent_step(
            queue, [system, *messages], key=KEY, text=text, tool_calls=calls, call_id=call.pk
        )
    run = recorded.trajectory
    feedback_record(
        queue=queue,
        token=None,
        call_id=None,
        trajectory_ref=KEY,
        reward=1.0,
        success=True,
        comment=f"Jane ({EMAIL}) confirmed the refund to {CARD}.",
    )
    feedback_record(
        queue=queue,
        token=None,
        call_id=run.steps.get(position=1).call_id,
        trajectory_ref=None,
        reward=0.0,
        success=None,
        comment="Escalate first.",
        corrected_action={
            "tool_calls": [_call("escalate", "fix_1", {"order_id": "4821", **contact})]
        },
    )
    Feedback.objects.filter(trajectory=run).update(token=token)  # posted through the token
    approver = UserFactory(username="approver-ann", email="ann@example.org")
    Trajectory.objects.filter(pk=run.pk).update(
        approval=Trajectory.Approval.APPROVED, approved_by=approver, approved_at=timezone.now()
    )
    identities = [approver.username, approver.email, token.name, token.prefix, plain, end_user]
    return PersonalRun(trajectory=run, identities=identities)


def exported(**filters: Any) -> dict[str, list[dict[str, Any]]]:
    """Every format's lines, as the download writes them."""
    return {
        fmt: [
            json.loads(line)
            for line in trajectory_export_lines(
                fmt=fmt, filters=TrajectoryFilters(**filters), consumer="tests"
            )
        ]
        for fmt in TRAJECTORY_FORMATS
    }


def the_bytes(by_format: dict[str, list[dict[str, Any]]]) -> bytes:
    return "".join(
        json.dumps(line, ensure_ascii=False) + "\n"
        for lines in by_format.values()
        for line in lines
    ).encode()


def personal_data_in(content: bytes, run: PersonalRun) -> list[str]:
    found = [EMAIL, CARD, CARD.replace(" ", ""), KEY, "jane_doe", *run.identities]
    return [text for text in found if text.encode() in content]


def test_an_anonymised_run_holds_no_identity_and_no_personal_data() -> None:
    run = personal_run(QueueFactory())
    anonymised = exported(anonymize=True)
    # Every format has a line to look into: canonical, a run that succeeded, a corrected step.
    assert {fmt: len(lines) for fmt, lines in anonymised.items()} == dict.fromkeys(
        TRAJECTORY_FORMATS, 1
    )
    content = the_bytes(anonymised)
    assert personal_data_in(content, run) == []
    assert b"[email]" in content and b"[card number]" in content
    [record] = anonymised["canonical"]
    assert record["key"] is None and record["trajectory_id"] == str(run.trajectory.pk)
    assert (
        record["goal"] == "I am [email]; order 4821 arrived broken, refund my card [card number]."
    )
    # Still training data: OpenAI takes the line, the arguments are still JSON objects.
    assert finetune_line_problems(anonymised["openai"][0]) == []
    [trl] = anonymised["trl"]
    assert trl["messages"][4]["tool_calls"][0]["function"]["arguments"] == {
        "order_id": "4821",
        "amount": 20,
        "email": "[email]",
        "card": "[card number]",
    }
    [pair] = anonymised["pairs"]
    assert pair["chosen"][0]["tool_calls"][0]["function"]["arguments"]["email"] == "[email]"
    assert ExportRun.objects.filter(filters__anonymize=True).count() == len(TRAJECTORY_FORMATS)


def test_not_anonymised_the_run_is_exported_as_stored_under_the_redaction_mode(
    settings: Any,
) -> None:
    run = personal_run(QueueFactory())
    # REDACTION=captured (the default) or all: end users' words leave redacted; identities
    # stay (the run's key, a user's name) until anonymised.
    assert personal_data_in(the_bytes(exported()), run) == [KEY, "jane_doe"]
    settings.REDACTION = "off"
    plain = exported()
    assert personal_data_in(the_bytes(plain), run) == [
        EMAIL,
        CARD,
        KEY,
        "jane_doe",
    ]  # who approved it, the token and the calls' `user` were never exported
    [record] = plain["canonical"]
    trajectory = run.trajectory
    assert (record["key"], record["goal"]) == (KEY, trajectory.goal)
    steps = list(trajectory.steps.order_by("position"))
    assert [s["observation"] for s in record["steps"]] == [s.observation for s in steps]
    assert [s["action"]["tool_calls"] for s in record["steps"]] == [s.tool_calls for s in steps]
    assert record["steps"][2]["action"]["content"] == steps[2].action_text
    stored = {str(f.pk): f for f in trajectory.feedback.all()}
    for each in record["feedback"]:
        assert each["comment"] == stored[each["id"]].comment
        assert each["corrected_action"] == (stored[each["id"]].corrected_action or None)


def test_the_command_the_download_and_the_api_each_anonymise(tmp_path: Path) -> None:
    queue = QueueFactory()
    run = personal_run(queue)
    out = tmp_path / "runs.jsonl"
    call_command("export_trajectories", "--anonymize", "--out", str(out))
    assert personal_data_in(out.read_bytes(), run) == []
    call_command("export_trajectories", "--out", str(out))
    assert KEY.encode() in out.read_bytes()

    curator = UserFactory()
    member_add(queue, curator, "curator")
    client = Client()
    client.force_login(curator)
    page = client.get("/export/trajectories/")
    assert b'name="anonymize"' in page.content
    form = {"format": "canonical", "queue": queue.pk, "outcome": ""}
    for chosen, anonymised in ((form, False), ({**form, "anonymize": "on"}, True)):
        response = client.post("/export/trajectories/", chosen)
        content = b"".join(response.streaming_content)  # type: ignore[attr-defined]
        assert (personal_data_in(content, run) == []) is anonymised

    _, token = token_create(queue=queue, name="trainer", scopes=["export"])
    auth = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    for query, anonymised in (("", False), ("&anonymize=true", True)):
        response = client.get(f"/api/v1/exports/trajectories?format=pairs{query}", **auth)
        content = b"".join(response.streaming_content)  # type: ignore[attr-defined]
        assert (personal_data_in(content, run) == []) is anonymised


def test_an_address_in_a_compact_tool_result_is_redacted_from_the_decision_point() -> None:
    queue = QueueFactory()
    lookup = _call("lookup_order", "call_1", {"order_id": "4821"})
    result = json.dumps({"customer": EMAIL}, separators=(",", ":"))
    goal = {"role": "user", "content": "Order 4821 arrived broken."}
    looked = {"role": "tool", "tool_call_id": "call_1", "content": result}
    agent_step(queue, [goal], key=KEY, tool_calls=[lookup])
    messages = [goal, {"role": "assistant", "tool_calls": [lookup]}, looked]
    step = agent_step(queue, messages, key=KEY, text="Refunding.").step
    # The gateway's decision point after a tool result: the goal, then the result.
    Step.objects.filter(pk=step.pk).update(decision_point=f"{goal['content']}\n\n{result}")
    assert EMAIL.encode() not in the_bytes(exported(anonymize=True))
