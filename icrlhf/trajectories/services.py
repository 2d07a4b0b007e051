"""Grouping an agent's calls into trajectories, one step per call.

A call belongs to the trajectory its caller names (the `X-Icrlhf-Trajectory` header, or
`metadata.trajectory_id`). Without a name, it continues the trajectory whose step's messages
and answer its own messages begin with: an agent sends its whole conversation every time, so
the next call of a run extends the last one's. Otherwise it begins a new trajectory."""

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import CharField, F, Q, QuerySet, Value
from django.db.models.functions import Cast, Concat
from django.utils import timezone
from django.utils.crypto import salted_hmac

from icrlhf.queues.models import Queue
from icrlhf.trajectories.models import Feedback, Step, Trajectory
from icrlhf.trajectories.turns import step_message

KEY_MAX_LENGTH = 200


def _comparable(message: dict[str, Any]) -> list[Any]:
    """What identifies a message when a caller sends it back: an assistant's tool calls
    (their ids, names and arguments; clients differ in the content they send beside them),
    or a message's role, text and the call it answers."""
    role = message.get("role")
    calls = message.get("tool_calls") or []
    if role == "assistant" and calls:
        functions = [(c.get("id"), c.get("function") or {}) for c in calls]
        return [role, [[id_, f.get("name"), f.get("arguments")] for id_, f in functions]]
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return [role, (content or "").strip(), message.get("tool_call_id") or ""]


def conversation_hash(messages: list[dict[str, Any]]) -> str:
    comparable = [_comparable(m) for m in messages if m.get("role") not in ("system", "developer")]
    return hashlib.sha256(json.dumps(comparable, ensure_ascii=False).encode()).hexdigest()


# Changing it would part every end user from their runs (see migration 0005).
_END_USER_SALT = "icrlhf.trajectories.end_user"


def end_user_key(user: str) -> str:
    """The end user a call names in `user`, as a run's owner is stored: a keyed hash (HMAC
    with SECRET_KEY), so that runs are told apart by end user while the id itself is kept
    nowhere and cannot be guessed back from the hash. "" (no end user) stays ""."""
    if not user:
        return ""
    return salted_hmac(_END_USER_SALT, user, algorithm="sha256").hexdigest()


@dataclass(frozen=True)
class RunOwner:
    """Who a run belongs to: the token whose calls made it, and the end user they named (as
    `end_user_key` stores it)."""

    token_id: int | None
    end_user: str = ""

    def runs(self, queue: Queue) -> "QuerySet[Trajectory]":
        return Trajectory.objects.filter(
            queue=queue, token_id=self.token_id, end_user=self.end_user
        )


@dataclass(frozen=True)
class RunHashes:
    """What recognises a call's run without its words, computed from the call as the caller
    has it (before any redaction): `continuation`, the conversation as the agent's next call
    sends it back (this call's messages and its answer); `prefixes`, the digest of each start
    of this call's messages that ends with an assistant message (an earlier step's
    continuation), with its length in messages."""

    continuation: str
    prefixes: dict[str, int]


def run_hashes(
    *, messages: list[dict[str, Any]], answer_text: str, tool_calls: list[dict[str, Any]]
) -> RunHashes:
    # The answer as the assistant message it becomes in the caller's next call.
    answer = step_message(text=answer_text, tool_calls=tool_calls)
    return RunHashes(
        continuation=conversation_hash([*messages, answer]),
        # Longest first: the earlier steps' ends.
        prefixes={
            conversation_hash(messages[:end]): end
            for end in range(len(messages), 0, -1)
            if messages[end - 1].get("role") == "assistant"
        },
    )


@dataclass(frozen=True)
class StepRecorded:
    trajectory: Trajectory
    step: Step


def step_record(
    *,
    queue: Queue,
    owner: RunOwner,
    key: str,
    messages: list[dict[str, Any]],
    hashes: RunHashes,
    decision_point: str,
    action_text: str,
    tool_calls: list[dict[str, Any]],
    tool_names: list[str],
    call_id: Any,
    created_at: datetime,
) -> StepRecorded:
    """Record one call as the next step of its owner's trajectory.

    `messages`, `action_text` and `tool_calls` are stored as given (redacted already, when
    REDACTION says so); the run is recognised by `hashes`, which `run_hashes` computes from
    the call as the caller has it."""
    key = key.strip()[:KEY_MAX_LENGTH]
    with transaction.atomic():
        trajectory, seen = _trajectory_for(
            queue=queue, owner=owner, key=key, prefixes=hashes.prefixes
        )
        # A new unnamed run is created with this step counted: no other call can reach it
        # before the step is stored (it is found by the step's continuation). A named run's
        # first call may have a twin that creates the row first: it is counted as the others.
        counted = trajectory is None and not key
        if trajectory is None:
            trajectory = _trajectory_create(
                queue=queue,
                owner=owner,
                key=key,
                messages=messages,
                tool_names=tool_names,
                at=created_at,
                step_count=1 if counted else 0,
            )
        if not counted:
            Trajectory.objects.filter(pk=trajectory.pk).update(
                step_count=F("step_count") + 1, last_step_at=created_at
            )
            trajectory.refresh_from_db(fields=["step_count", "last_step_at"])
        # The observation: what the agent saw since its previous step (all of it, first).
        observation = [m for m in messages[seen:] if m.get("role") not in ("system", "developer")]
        step = Step.objects.create(
            trajectory=trajectory,
            position=trajectory.step_count - 1,
            call_id=call_id,
            created_at=created_at,
            observation=observation,
            decision_point=decision_point,
            action_text="" if tool_calls else action_text,
            tool_calls=tool_calls,
            continuation_hash=hashes.continuation,
        )
    return StepRecorded(trajectory=trajectory, step=step)


def _trajectory_for(
    *, queue: Queue, owner: RunOwner, key: str, prefixes: dict[str, int]
) -> tuple[Trajectory | None, int]:
    """The trajectory of its owner's that the call continues, and how many of its messages
    that trajectory has seen already (None, 0: a new one). Another token's run, or another
    end user's, is never continued, however alike the conversations are."""
    if key:
        named = owner.runs(queue).filter(key=key).first()
        if named is None or not prefixes:
            return named, 0
        hashes = named.steps.filter(continuation_hash__in=prefixes).values_list(
            "continuation_hash", flat=True
        )
        return named, max((prefixes[h] for h in hashes), default=0)
    if not prefixes:  # no assistant message yet: a conversation's first call continues none
        return None, 0
    candidates = Step.objects.filter(
        trajectory__in=owner.runs(queue), continuation_hash__in=prefixes
    ).select_related("trajectory")

    def is_latest(step: Step) -> bool:
        return step.position == step.trajectory.step_count - 1

    # The longest conversation continued, and only from its run's latest step: two people who
    # began alike ("hi", the same greeting) and went on apart are two runs, not one.
    best = max(
        candidates,
        key=lambda s: (prefixes[s.continuation_hash], is_latest(s), s.created_at),
        default=None,
    )
    if best is None or not is_latest(best):
        return None, 0
    return best.trajectory, prefixes[best.continuation_hash]


def _trajectory_create(
    *,
    queue: Queue,
    owner: RunOwner,
    key: str,
    messages: list[dict[str, Any]],
    tool_names: list[str],
    at: datetime,
    step_count: int,
) -> Trajectory:
    goal = next((str(m.get("content") or "") for m in messages if m.get("role") == "user"), "")
    fields = {
        "grouping": Trajectory.Grouping.KEY if key else Trajectory.Grouping.CONTINUATION,
        "goal": goal,
        "tool_names": tool_names,
        "created_at": at,
        "last_step_at": at,
        "step_count": step_count,
        "token_id": owner.token_id,
        "end_user": owner.end_user,
    }
    if not key:
        return Trajectory.objects.create(queue=queue, **fields)
    try:
        with transaction.atomic():
            return Trajectory.objects.create(queue=queue, key=key, **fields)
    except IntegrityError:  # two first calls of one named run at once: one row wins
        return owner.runs(queue).get(key=key)


def trajectories_purge(*, before: datetime) -> int:
    """Blank what end users wrote, and what identifies them, once it is older than `before`
    (the call log's retention), each by its own age: a step's messages and actions, a
    feedback's comment, correction and key, a run's goal (its first step's words), even while
    the run goes on. A run whose last step is that old is purged whole: the same, and its key
    and end user's id, and it is marked `purged_at` (never continued again). Outcomes,
    rewards and step counts stay. Every run past the period is purged once, resumed ones (no
    goal) too. Returns how many runs were purged whole."""
    expired = list(
        Trajectory.objects.filter(last_step_at__lt=before, purged_at__isnull=True).values_list(
            "pk", flat=True
        )
    )
    # The continuation digest goes too: an old step of a run that goes on is not the one it
    # is continued from (its latest is recent), and a purged run is never continued (its
    # new steps would keep end users' words past the period, as `purged_at` says it was done).
    Step.objects.filter(Q(created_at__lt=before) | Q(trajectory_id__in=expired)).filter(
        ~Q(observation=[])
        | ~Q(decision_point="")
        | ~Q(action_text="")
        | ~Q(tool_calls=[])
        | ~Q(continuation_hash="")
    ).update(observation=[], decision_point="", action_text="", tool_calls=[], continuation_hash="")
    # A feedback key stays unique per token: it becomes the row's own id.
    purged_key = Concat(Value("purged:"), Cast("pk", CharField()))
    Feedback.objects.filter(Q(created_at__lt=before) | Q(trajectory_id__in=expired)).filter(
        ~Q(comment="") | ~Q(corrected_action={}) | ~Q(key=purged_key)
    ).update(comment="", corrected_action={}, key=purged_key)
    Trajectory.objects.filter(created_at__lt=before).exclude(goal="").update(goal="")
    return Trajectory.objects.filter(pk__in=expired).update(
        goal="", key="", end_user="", purged_at=timezone.now()
    )
