"""Feedback from the application: a reward and/or success on a call (one step) or on a whole
trajectory, recorded once per key."""

import hashlib
import json
import uuid
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import QuerySet

from icrlhf.ingest.models import IntegrationToken
from icrlhf.integrations import journal, untrusted_json
from icrlhf.integrations.redaction import scrub
from icrlhf.queues.models import Queue
from icrlhf.trajectories.models import Feedback, Step, Trajectory
from icrlhf.trajectories.rewards import (
    correction_apply,
    learnt_reward,
    rewards_apply,
    run_usage_credit,
    step_tool_names,
)


class FeedbackTargetMissing(Exception):
    """The call or trajectory named is not the token's (or not logged yet)."""


class FeedbackKeyConflict(Exception):
    """The key was used before with another body: which fields differ."""


class CorrectionRefused(Exception):
    """A corrected action that cannot be the step's: `field` names where, the message why."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def _correction_check(step: Step | None, action: dict[str, Any]) -> None:
    """A correction on a call may call only the tools that call offered (it becomes an
    example that calls them), with arguments that are a JSON object, as a model's are."""
    calls = action.get("tool_calls") or []
    if step is None or not calls:
        return
    offered = step_tool_names(step)
    for number, call in enumerate(calls):
        where = f"corrected_action.tool_calls.{number}.function"
        function = call.get("function") or {}
        name = function.get("name")
        if name not in offered:
            tools = ", ".join(offered) if offered else "none"
            raise CorrectionRefused(
                f"{where}.name",
                f"The call offered no tool “{name}” (it offered: {tools}); a correction "
                "may call only the tools its call offered.",
            )
        try:
            arguments = untrusted_json.loads(function.get("arguments") or "{}")
        except untrusted_json.NotJson as error:
            raise CorrectionRefused(
                f"{where}.arguments",
                f"The arguments must be a JSON object, as a call's are ({error}).",
            ) from None
        if not isinstance(arguments, dict):
            raise CorrectionRefused(
                f"{where}.arguments", "The arguments must be a JSON object, as a call's are."
            )


@dataclass(frozen=True)
class FeedbackRecorded:
    feedback: Feedback
    created: bool


def _target(
    *,
    queue: Queue,
    token: IntegrationToken | None,
    call_id: uuid.UUID | None,
    trajectory_ref: str | None,
) -> tuple[Trajectory, Step | None]:
    """The run (and step) the feedback is on: among the token's own runs (a reviewer, with
    no token, may name any run of the queue). Another token's run or call is not found, as
    if it did not exist."""
    runs = Trajectory.objects.filter(queue=queue)
    if token is not None:
        runs = runs.filter(token=token)
    if call_id is not None:
        steps = Step.objects.select_related("trajectory", "call").filter(
            call_id=call_id, trajectory__in=runs
        )
        step = steps.first()
        # A call answered a moment ago may still be on its way to the log (the gateway writes
        # it after the answer): wait for it, if it is the token's, then look again.
        owner = None if token is None else str(token.pk)
        if step is None and journal.waited_for(
            journal.CALLS, str(call_id), owner=owner, timeout_s=5.0
        ):
            step = steps.first()
        if step is None:
            raise FeedbackTargetMissing(
                f"No call {call_id} made with this token. A call is logged once its answer "
                "has been sent (a stream: once it ended); if it has just ended, retry in a "
                "second."
            )
        return step.trajectory, step
    reference = (trajectory_ref or "").strip()
    found = _run_named(runs, reference)
    # A run whose first call was answered a moment ago may still be on its way to the log:
    # wait for the token's own calls that named it, and for nothing else (a name no call
    # used answers at once, whatever else is on its way).
    if (
        found is None
        and token is not None
        and journal.waited_for_run(
            journal.CALLS, owner=str(token.pk), run_key=reference, timeout_s=5.0
        )
    ):
        found = _run_named(runs, reference)
    if found is None:
        raise FeedbackTargetMissing(
            f"No trajectory “{reference}” made with this token (give the id you sent as "
            "X-Icrlhf-Trajectory or metadata.trajectory_id, or the trajectory's own id)."
        )
    return found, None


def _run_named(runs: QuerySet[Trajectory], reference: str) -> Trajectory | None:
    """The run `reference` names among `runs`: the trajectory's own id first (an
    application's key that looks like one names no other run); then the caller's key. Runs
    grouped by their messages have no key: "" names none."""
    try:
        found = runs.filter(pk=uuid.UUID(reference)).first()
    except ValueError:
        found = None
    if found is None:
        named = list(runs.filter(key=reference).exclude(key="")[:2])
        if len(named) > 1:
            raise FeedbackTargetMissing(
                f"Several of this token's runs are named “{reference}”, for different end "
                "users (`user`): give the trajectory's own id (the feedback's trajectory_id)."
            )
        found = named[0] if named else None
    return found


@dataclass(frozen=True)
class _Body:
    """What a feedback says, as it is stored: a retry under its key must say the same."""

    trajectory: Trajectory
    step: Step | None
    reward: float | None
    success: bool | None
    comment: str
    corrected: dict[str, Any]

    def differences(self, earlier: Feedback) -> list[str]:
        """The fields in which this body differs from the feedback first posted."""
        pairs = {
            "target": (
                (self.trajectory.pk, self.step.pk if self.step else None),
                (earlier.trajectory_id, earlier.step_id),
            ),
            "reward": (self.reward, earlier.reward),
            "success": (self.success, earlier.success),
            "comment": (self.comment, earlier.comment),
            "corrected_action": (self.corrected, earlier.corrected_action),
        }
        return [name for name, (now, then) in pairs.items() if now != then]


def feedback_record(
    *,
    queue: Queue,
    token: IntegrationToken | None,
    call_id: uuid.UUID | None,
    trajectory_ref: str | None,
    reward: float | None,
    success: bool | None,
    comment: str = "",
    corrected_action: dict[str, Any] | None = None,
    key: str = "",
) -> FeedbackRecorded:
    """Record the feedback and put its reward where it belongs: on the step (feedback on a
    call) or on the trajectory, whose outcome `success` sets. A `corrected_action` on a call
    teaches memory the step's right action (rewards.correction_apply); it may call only the
    tools the call offered (else CorrectionRefused, and nothing is saved).

    Keys are the token's own, as a payment API's idempotency keys are: the same key with
    the same body returns the first record and changes nothing; with another body it raises
    FeedbackKeyConflict. With no key, the same feedback again is the same record."""
    trajectory, step = _target(
        queue=queue, token=token, call_id=call_id, trajectory_ref=trajectory_ref
    )
    _correction_check(step, corrected_action or {})
    # Stored as the call log keeps end users' words (the comment may quote them).
    comment = scrub(comment, into="log")
    corrected = scrub(corrected_action or {}, into="log")
    if not key:
        content = [str(trajectory.pk), step.pk if step else None, reward, success, comment]
        digest = json.dumps([*content, corrected], sort_keys=True, default=str)
        key = "auto:" + hashlib.sha256(digest.encode()).hexdigest()
    body = _Body(
        trajectory=trajectory,
        step=step,
        reward=reward,
        success=success,
        comment=comment,
        corrected=corrected,
    )
    earlier = Feedback.objects.filter(queue=queue, token=token, key=key).first()
    if earlier is None:
        try:
            return FeedbackRecorded(
                feedback=_feedback_create(queue=queue, token=token, key=key, body=body),
                created=True,
            )
        except IntegrityError:  # the same key posted twice at once: the first one stands
            earlier = Feedback.objects.get(queue=queue, token=token, key=key)
    if differences := body.differences(earlier):
        raise FeedbackKeyConflict(
            f"The key “{key}” was used for other feedback (its {', '.join(differences)} "
            "differed); use a new key for new feedback."
        )
    return FeedbackRecorded(feedback=earlier, created=False)


@transaction.atomic
def _feedback_create(
    *,
    queue: Queue,
    token: IntegrationToken | None,
    key: str,
    body: _Body,
) -> Feedback:
    trajectory, step, reward, success = body.trajectory, body.step, body.reward, body.success
    feedback = Feedback.objects.create(
        queue=queue,
        trajectory=trajectory,
        step=step,
        key=key,
        reward=reward,
        success=success,
        comment=body.comment,
        corrected_action=body.corrected,
        token=token,
    )
    if step is not None and reward is not None:
        Step.objects.filter(pk=step.pk).update(reward=reward)
    learnt = learnt_reward(reward=reward, success=success)
    if step is None:
        # The run's reward is the one memory learns (success alone: 1, failure: 0), so that
        # the low-reward rule, the run's page and the exports read the same number.
        changes: dict[str, Any] = {} if learnt is None else {"reward": learnt}
        if success is not None:
            changes["outcome"] = (
                Trajectory.Outcome.SUCCEEDED if success else Trajectory.Outcome.FAILED
            )
        if changes:
            Trajectory.objects.filter(pk=trajectory.pk).update(**changes)
    if learnt is None or queue.reward_threshold is None:
        return feedback
    if queue.rewards_need_approval:
        # Nothing changes before a reviewer approves: no memory, no usage credit (pruning),
        # no capture (rewards.rewards_approval_decide does what follows, on approval).
        Trajectory.objects.filter(pk=trajectory.pk).update(approval=Trajectory.Approval.PENDING)
        return feedback
    if step is None:
        run_usage_credit(queue=queue, trajectory=trajectory, reward=learnt)
    if step is not None and body.corrected:
        correction_apply(queue=queue, feedback=feedback)
    else:
        rewards_apply(queue=queue, trajectory=trajectory, reward=learnt, step=step)
    return feedback
