"""Feedback from the application: a reward and/or success on a call (one step) or on a whole
trajectory, recorded once per key."""

import hashlib
import json
import uuid
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, transaction

from icrlhf.ingest.models import IntegrationToken
from icrlhf.queues.models import Queue
from icrlhf.trajectories.models import Feedback, Step, Trajectory
from icrlhf.trajectories.rewards import learnt_reward, rewards_apply, run_usage_credit


class FeedbackTargetMissing(Exception):
    """The call or trajectory named is not in the token's queue (or not logged yet)."""


@dataclass(frozen=True)
class FeedbackRecorded:
    feedback: Feedback
    created: bool


def _target(
    *, queue: Queue, call_id: uuid.UUID | None, trajectory_ref: str | None
) -> tuple[Trajectory, Step | None]:
    if call_id is not None:
        step = (
            Step.objects.select_related("trajectory")
            .filter(call_id=call_id, trajectory__queue=queue)
            .first()
        )
        if step is None:
            raise FeedbackTargetMissing(
                f"No call {call_id} in this queue. A call is logged once its answer has been "
                "sent (a stream: once it ended); if it has just ended, retry in a second."
            )
        return step.trajectory, step
    reference = (trajectory_ref or "").strip()
    # The trajectory's own id first (an application's key that looks like one names no other
    # run); then the caller's key. Runs grouped by their messages have no key: "" names none.
    try:
        found = Trajectory.objects.filter(queue=queue, pk=uuid.UUID(reference)).first()
    except ValueError:
        found = None
    if found is None:
        found = Trajectory.objects.filter(queue=queue, key=reference).exclude(key="").first()
    if found is None:
        raise FeedbackTargetMissing(
            f"No trajectory “{reference}” in this queue (give the id you sent as "
            "X-Icrlhf-Trajectory or metadata.trajectory_id, or the trajectory's own id)."
        )
    return found, None


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
    call) or on the trajectory, whose outcome `success` sets. The same key again (or, with no
    key, the same feedback again) returns the first record and changes nothing."""
    trajectory, step = _target(queue=queue, call_id=call_id, trajectory_ref=trajectory_ref)
    corrected = corrected_action or {}
    if not key:
        content = [str(trajectory.pk), step.pk if step else None, reward, success, comment]
        digest = json.dumps([*content, corrected], sort_keys=True, default=str)
        key = "auto:" + hashlib.sha256(digest.encode()).hexdigest()
    earlier = Feedback.objects.filter(queue=queue, key=key).first()
    if earlier is not None:
        return FeedbackRecorded(feedback=earlier, created=False)
    try:
        with transaction.atomic():
            feedback = Feedback.objects.create(
                queue=queue,
                trajectory=trajectory,
                step=step,
                key=key,
                reward=reward,
                success=success,
                comment=comment,
                corrected_action=corrected,
                token=token,
            )
            if step is not None and reward is not None:
                Step.objects.filter(pk=step.pk).update(reward=reward)
            learnt = learnt_reward(reward=reward, success=success)
            if learnt is not None and step is None:
                run_usage_credit(queue=queue, trajectory=trajectory, reward=learnt)
            if learnt is not None and queue.reward_threshold is not None:
                if queue.rewards_need_approval:  # a reviewer approves first (rewards.py)
                    Trajectory.objects.filter(pk=trajectory.pk).update(
                        approval=Trajectory.Approval.PENDING
                    )
                else:
                    rewards_apply(queue=queue, trajectory=trajectory, reward=learnt, step=step)
            if step is None:
                changes: dict[str, Any] = {}
                if reward is not None:
                    changes["reward"] = reward
                if success is not None:
                    outcome = Trajectory.Outcome.SUCCEEDED if success else Trajectory.Outcome.FAILED
                    changes["outcome"] = outcome
                if changes:
                    Trajectory.objects.filter(pk=trajectory.pk).update(**changes)
    except IntegrityError:  # the same key posted twice at once: the first one stands
        return FeedbackRecorded(feedback=Feedback.objects.get(queue=queue, key=key), created=False)
    return FeedbackRecorded(feedback=feedback, created=True)
