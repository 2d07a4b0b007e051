"""Agent runs as training data: one code path for the command, the download and the API,
streamed chunk by chunk like the decisions' export.

Canonical (schema_version 1): one record per trajectory — its goal, outcome, reward, the
system messages and tools its latest call sent, every step (the observation, the decision
point, the action and the step's reward) and the application's feedback. Each derived format
is computed from the canonical record alone:
- openai: {"messages": [...], "tools": [...]}  OpenAI's chat fine-tuning format, one line per
          run that succeeded (tool calls' arguments stay JSON strings, as OpenAI sends them);
- trl:    {"messages": [...], "tools": [...]}  TRL's conversational format with tools, the same
          runs (arguments as objects and tool results named, as chat templates read them);
- pairs:  {"prompt": [...], "chosen": [...], "rejected": [...], "tools": [...]}  a step's
          corrected action (the application's feedback) over the action the agent took, in
          TRL's conversational preference format.

Anonymised (icrlhf.export.anonymity, as the decisions' export): the run's key, the
application's id for it, is null, and the run's text — goal, messages, actions, tool calls and
their results, feedback's comments and corrected actions — passes redaction. Who approved the
run and which token posted its feedback are never exported.
"""

from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Q, QuerySet

from icrlhf.export import anonymity
from icrlhf.export.formats import SCHEMA_VERSION, Record
from icrlhf.export.models import ExportRun
from icrlhf.integrations import untrusted_json
from icrlhf.queues.models import Queue
from icrlhf.trajectories.models import Feedback, Step, Trajectory
from icrlhf.trajectories.turns import Message, step_message, step_turns

TRAJECTORY_FORMATS = ("canonical", "openai", "trl", "pairs")
CHUNK = 200  # runs per chunk: each carries its steps and their conversations
_SYSTEM = ("system", "developer")  # not in a step's observation: the caller's instructions


@dataclass(frozen=True)
class TrajectoryFilters:
    queue: Queue | None = None
    # The queues the person exporting may export; None for all (admins, the command line).
    allowed_queue_ids: frozenset[int] | None = None
    outcome: str = ""  # "succeeded", "failed", "open", or "" for any
    anonymize: bool = False

    def describe(self) -> dict[str, Any]:
        return {
            "queue": self.queue.slug if self.queue else None,
            "allowed_queue_ids": (
                None if self.allowed_queue_ids is None else sorted(self.allowed_queue_ids)
            ),
            "outcome": self.outcome,
            "anonymize": self.anonymize,
        }


def trajectories_filtered(filters: TrajectoryFilters) -> QuerySet[Trajectory]:
    found = Trajectory.objects.filter(step_count__gt=0)
    if filters.allowed_queue_ids is not None:
        found = found.filter(queue_id__in=filters.allowed_queue_ids)
    if filters.queue is not None:
        found = found.filter(queue=filters.queue)
    if filters.outcome:
        found = found.filter(outcome="" if filters.outcome == "open" else filters.outcome)
    return found


def _chunks(trajectories: QuerySet[Trajectory]) -> Iterator[list[Trajectory]]:
    """Keyset pagination on (created_at, id), as the decisions' export pages."""
    ordered = trajectories.select_related("queue").order_by("created_at", "id")
    after: tuple[datetime, Any] | None = None
    while True:
        page = ordered
        if after is not None:
            page = page.filter(Q(created_at__gt=after[0]) | Q(created_at=after[0], id__gt=after[1]))
        rows = list(page[:CHUNK])
        if not rows:
            return
        yield rows
        after = (rows[-1].created_at, rows[-1].pk)


def _iso(value: datetime) -> str:
    return value.isoformat()


def canonical_trajectories(
    trajectories: QuerySet[Trajectory], *, anonymize: bool
) -> Iterator[Record]:
    for rows in _chunks(trajectories):
        ids = [t.pk for t in rows]
        steps: dict[Any, list[Step]] = defaultdict(list)
        for step in (
            Step.objects.filter(trajectory_id__in=ids)
            .select_related("call")
            .order_by("trajectory_id", "position", "pk")
        ):
            steps[step.trajectory_id].append(step)
        feedback: dict[Any, list[Feedback]] = defaultdict(list)
        for each in (
            Feedback.objects.filter(trajectory_id__in=ids)
            .select_related("step")
            .order_by("created_at", "pk")
        ):
            feedback[each.trajectory_id].append(each)
        for trajectory in rows:
            yield _canonical(
                trajectory, steps[trajectory.pk], feedback[trajectory.pk], anonymize=anonymize
            )


def _canonical(
    trajectory: Trajectory, steps: list[Step], feedback: list[Feedback], *, anonymize: bool
) -> Record:
    calls = [s.call for s in steps if s.call is not None]
    latest = calls[-1] if calls else None
    # Every tool the run's calls offered (a run may change them; the latest definition of a
    # name stands), so that each call in the run names an offered tool.
    by_name: dict[str, Any] = {}
    for call in calls:
        for tool in call.options.get("tools") or []:
            name = (tool.get("function") or {}).get("name") if isinstance(tool, dict) else None
            by_name[str(name)] = tool
    tools = list(by_name.values())
    system = [m for m in (latest.context if latest is not None else []) if m.get("role") in _SYSTEM]
    return {
        "schema_version": SCHEMA_VERSION,
        "trajectory_id": str(trajectory.pk),
        "queue": {"slug": trajectory.queue.slug, "name": trajectory.queue.name},
        "key": anonymity.identity(trajectory.key, anonymize=anonymize),
        "grouping": trajectory.grouping,
        "goal": anonymity.text(trajectory.goal, anonymize=anonymize),
        "outcome": trajectory.outcome or None,
        "reward": trajectory.reward,
        "created_at": _iso(trajectory.created_at),
        "last_step_at": _iso(trajectory.last_step_at),
        "system": anonymity.messages(system, anonymize=anonymize),
        "tools": tools,
        "steps": [
            {
                "position": step.position,
                "created_at": _iso(step.created_at),
                "call_id": str(step.call_id) if step.call_id else None,
                "model": step.call.model if step.call is not None else None,
                "observation": anonymity.messages(step.observation, anonymize=anonymize),
                "decision_point": anonymity.text(step.decision_point, anonymize=anonymize),
                "action": {
                    "content": anonymity.text(step.action_text, anonymize=anonymize) or None,
                    "tool_calls": anonymity.tool_calls(step.tool_calls, anonymize=anonymize),
                },
                "reward": step.reward,
            }
            for step in steps
        ],
        "feedback": [
            {
                "id": str(each.pk),
                "step_position": each.step.position if each.step is not None else None,
                "reward": each.reward,
                "success": each.success,
                "comment": anonymity.text(each.comment, anonymize=anonymize),
                "corrected_action": (
                    anonymity.action(each.corrected_action, anonymize=anonymize) or None
                ),
                "created_at": _iso(each.created_at),
            }
            for each in feedback
        ],
    }


# --- derived formats, from the canonical record alone ----------------------------------------


@dataclass
class _RecordStep:
    """The fields of a canonical step that step_turns reads."""

    observation: list[Message]
    action_text: str
    tool_calls: list[dict[str, Any]]


def _turns(record: Record) -> list[tuple[list[Message], Message, dict[str, Any]]]:
    """(the conversation before, the action, the canonical step) for each step."""
    steps = record["steps"]
    shaped = [
        _RecordStep(
            observation=s["observation"],
            action_text=s["action"]["content"] or "",
            tool_calls=s["action"]["tool_calls"],
        )
        for s in steps
    ]
    turns = step_turns(shaped)
    return [(t.before, t.action, s) for t, s in zip(turns, steps, strict=True)]


def _openai_message(message: Message) -> Message:
    """A message as OpenAI's fine-tuning reads it: no null content beside tool calls."""
    return {k: v for k, v in message.items() if not (k == "content" and v is None)}


class _NotTrainable(Exception):
    """A run a training format cannot carry as it is (its line is left out)."""


def _arguments(raw: Any) -> dict[str, Any]:
    """A call's arguments as the object chat templates read; a model's arguments that are not
    a JSON object would give the column two types, which Arrow (datasets) refuses."""
    try:
        parsed = untrusted_json.loads(raw) if isinstance(raw, str) else raw
    except untrusted_json.NotJson:
        raise _NotTrainable from None
    if not isinstance(parsed, dict):
        raise _NotTrainable
    return parsed


def _trl_messages(messages: list[Message]) -> list[Message]:
    """TRL's conversational messages: arguments as objects, tool results named by their call,
    and every message with a `content` (Arrow needs one type per column)."""
    names: dict[str, str] = {}
    shaped = []
    for message in messages:
        out = {**message, "content": message.get("content") or ""}
        if message.get("tool_calls"):
            out["tool_calls"] = [
                {
                    "id": call.get("id"),
                    "type": "function",
                    "function": {
                        "name": call["function"]["name"],
                        "arguments": _arguments(call["function"].get("arguments")),
                    },
                }
                for call in message["tool_calls"]
            ]
            names.update(
                {call.get("id"): call["function"]["name"] for call in message["tool_calls"]}
            )
        if message.get("role") == "tool":
            out["name"] = names.get(message.get("tool_call_id") or "", "")
        shaped.append(out)
    return shaped


def _succeeded(record: Record) -> bool:
    return record["outcome"] == Trajectory.Outcome.SUCCEEDED and bool(record["steps"])


def trajectory_derive(record: Record, fmt: str) -> Iterator[Record]:
    """The lines of `fmt` for one canonical record. A run whose content the call log's
    retention removed, or whose calls' arguments are not JSON objects, gives no training
    line (the canonical record keeps it)."""
    if fmt == "canonical":
        yield record
        return
    if fmt not in TRAJECTORY_FORMATS:
        raise ValueError(f"Unknown format {fmt!r}; choose one of {', '.join(TRAJECTORY_FORMATS)}.")
    if not record["goal"]:  # purged
        return
    try:
        yield from list(_derived(record, fmt))
    except _NotTrainable:
        return


def _derived(record: Record, fmt: str) -> Iterator[Record]:
    tools = record["tools"]
    if fmt in {"openai", "trl"}:
        if not _succeeded(record):  # fine-tuning learns from the runs that worked
            return
        before, action, _ = _turns(record)[-1]
        messages = [*record["system"], *before, action]
        if fmt == "openai":
            for message in messages:  # OpenAI refuses arguments that are not a JSON object
                for call in message.get("tool_calls") or []:
                    _arguments(call["function"].get("arguments"))
            yield {"messages": [_openai_message(m) for m in messages], "tools": tools}
        else:
            yield {"messages": _trl_messages(messages), "tools": tools}
    elif fmt == "pairs":
        by_position = {s["position"]: (before, action) for before, action, s in _turns(record)}
        for each in record["feedback"]:
            corrected = each["corrected_action"]
            if not corrected or each["step_position"] not in by_position:
                continue
            before, taken = by_position[each["step_position"]]
            chosen = step_message(
                text=corrected.get("content") or "", tool_calls=corrected.get("tool_calls") or []
            )
            if _calls_and_text(chosen) == _calls_and_text(taken):
                continue  # "corrected" to what was done: no preference
            yield {
                "prompt": _trl_messages([*record["system"], *before]),
                "chosen": _trl_messages([chosen]),
                "rejected": _trl_messages([taken]),
                "tools": tools,
            }


def _calls_and_text(message: Message) -> tuple[str, list[tuple[Any, Any]]]:
    calls = [
        (c["function"]["name"], _arguments(c["function"].get("arguments")))
        for c in message.get("tool_calls") or []
    ]
    return str(message.get("content") or ""), calls


def trajectory_export_lines(
    *, fmt: str, filters: TrajectoryFilters, consumer: str
) -> Iterator[str]:
    """JSON lines of the export; the export is recorded once the last line is out."""
    if fmt not in TRAJECTORY_FORMATS:
        raise ValueError(f"Unknown format {fmt!r}; choose one of {', '.join(TRAJECTORY_FORMATS)}.")
    count = 0
    found = trajectories_filtered(filters)
    for record in canonical_trajectories(found, anonymize=filters.anonymize):
        for line in trajectory_derive(record, fmt):
            count += 1
            # A call's arguments are read as JSON here (training formats): written back,
            # an escaped lone surrogate in them stays an escape, or the download fails.
            yield untrusted_json.dumps(line) + "\n"
    ExportRun.objects.create(
        consumer=consumer,
        queue=filters.queue,
        format=f"trajectory:{fmt}",
        filters=filters.describe(),
        records=count,
    )
