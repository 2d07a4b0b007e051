"""The queue's reward rule: rewarded steps become memory, preferred at or above the queue's
threshold and rejected below it (the icrl library stores only verified successes; a reward
below the bar teaches what not to do)."""

from dataclasses import dataclass, replace
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from icrlhf.integrations.redaction import scrub
from icrlhf.memory import signatures
from icrlhf.memory.curation import examples_credit
from icrlhf.memory.models import Example
from icrlhf.memory.services import (
    PREFERRED_REWARD,
    RewardedStep,
    StepCorrection,
    rewarded_steps_record,
    step_correction_record,
)
from icrlhf.queues.models import Queue
from icrlhf.trajectories.models import Feedback, Step, Trajectory
from icrlhf.trajectories.turns import step_turns


def learnt_reward(*, reward: float | None, success: bool | None) -> float | None:
    """What memory learns from feedback: the reward, or success as 1 and failure as 0."""
    return reward if reward is not None else (None if success is None else float(success))


def run_usage_credit(*, queue: Queue, trajectory: Trajectory, reward: float) -> None:
    """The examples a rewarded run's calls were prompted with are credited once: used, and
    helpful when the run's reward reaches the queue's threshold. Pruning (the queue's
    utility rule) then retires step examples that keep being retrieved into failing runs."""
    if queue.reward_threshold is None:
        return
    claimed = Trajectory.objects.filter(pk=trajectory.pk, usage_credited=False).update(
        usage_credited=True
    )
    if not claimed:  # an earlier feedback credited them
        return
    prompted = {
        str(used["id"])
        for examples in trajectory.steps.filter(call__isnull=False).values_list(
            "call__examples", flat=True
        )
        for used in examples or []
        # A format example taught the form of a call, not this run's choice: no credit, and
        # no blame that pruning would read against its own tool set.
        if not used.get("format")
    }
    examples_credit(
        example_ids=sorted(prompted),
        used_at=trajectory.last_step_at,
        accepted=reward >= queue.reward_threshold,
    )


class ApprovalConflict(Exception):
    """The run is not awaiting approval (decided already, or never rewarded), or it changed
    since the reviewer looked at it."""


@dataclass(frozen=True)
class RunSeen:
    """What a reviewer saw of a run when they chose: its steps and its feedback, by id."""

    step_ids: frozenset[int]
    feedback_ids: frozenset[str]

    @classmethod
    def of(cls, trajectory: Trajectory) -> "RunSeen":
        return cls(
            step_ids=frozenset(trajectory.steps.values_list("pk", flat=True)),
            feedback_ids=frozenset(
                str(pk) for pk in trajectory.feedback.values_list("pk", flat=True)
            ),
        )


def rewards_approval_decide(
    *, queue: Queue, trajectory_id: Any, reviewer: User, approve: bool, seen: RunSeen
) -> list[Example]:
    """A reviewer's approval of a rewarded run: approved, its feedback goes to memory, the
    latest first (a step takes the first reward that reaches memory, so what the reviewer saw
    last is what is stored), and the examples its calls were prompted with are credited;
    declined, nothing happens. Once; new feedback asks again. Refused when the run gained a
    step or a feedback since the reviewer saw it: they approve only what they saw."""
    with transaction.atomic():
        trajectory = (
            Trajectory.objects.select_for_update().filter(pk=trajectory_id, queue=queue).first()
        )
        if trajectory is None or trajectory.approval != Trajectory.Approval.PENDING:
            raise ApprovalConflict("This run is not awaiting approval: someone decided already.")
        now = RunSeen.of(trajectory)
        if now != seen:
            new_steps = len(now.step_ids - seen.step_ids)
            new_feedback = len(now.feedback_ids - seen.feedback_ids)
            raise ApprovalConflict(
                f"The run changed since you opened it ({new_steps} new step(s), "
                f"{new_feedback} new feedback): nothing was stored. Look at it again, then "
                "approve or decline."
            )
        stored: list[Example] = []
        if approve:
            feedback = list(
                Feedback.objects.filter(trajectory=trajectory)
                .select_related("step")
                .order_by("-created_at", "-pk")
            )
            run_reward = next(
                (
                    learnt
                    for each in feedback
                    if each.step is None
                    and (learnt := learnt_reward(reward=each.reward, success=each.success))
                    is not None
                ),
                None,
            )
            if run_reward is not None:
                run_usage_credit(queue=queue, trajectory=trajectory, reward=run_reward)
            # Corrections first, the latest of each step (a later one replaces an earlier):
            # a corrected step keeps its correction over any reward, as it does unapproved.
            corrections = [each for each in feedback if _corrects_a_step(each)]
            latest = {each.step_id: each for each in reversed(corrections)}
            for each in latest.values():
                stored += correction_apply(queue=queue, feedback=each)
            for each in feedback:
                learnt = learnt_reward(reward=each.reward, success=each.success)
                if learnt is not None and not _corrects_a_step(each):
                    stored += rewards_apply(
                        queue=queue, trajectory=trajectory, reward=learnt, step=each.step
                    )
        trajectory.approval = (
            Trajectory.Approval.APPROVED if approve else Trajectory.Approval.DECLINED
        )
        trajectory.approved_by, trajectory.approved_at = reviewer, timezone.now()
        trajectory.save(update_fields=["approval", "approved_by", "approved_at"])
    return stored


def step_tool_names(step: Step) -> list[str]:
    """The tools this step's call offered (a run may change them between calls; the run's
    once retention removed the call)."""
    if step.call is None:
        return [str(name) for name in step.trajectory.tool_names]
    return signatures.tool_names(step.call.options.get("tools"))


def _for_memory(message: dict[str, Any]) -> dict[str, Any]:
    return scrub(message, into="review")


def rewards_apply(
    *, queue: Queue, trajectory: Trajectory, reward: float, step: Step | None = None
) -> list[Example]:
    """Store the run's steps (or the one step) with `reward`, under the queue's rule; nothing
    when the queue has none."""
    if queue.reward_threshold is None:
        return []
    preferred = reward >= queue.reward_threshold
    rewarded = [
        _rewarded_step(
            turns.step,
            before=turns.before,
            results=turns.results,
            reward=reward,
            preferred=preferred,
        )
        for turns in step_turns(_locked_steps(trajectory), _for_memory)
        if step is None or turns.step.pk == step.pk
    ]
    return rewarded_steps_record(queue_id=queue.pk, steps=rewarded)


def _locked_steps(trajectory: Trajectory) -> QuerySet[Step]:
    """The run's steps in order, locked: two feedbacks on one run at once store its steps
    once (PostgreSQL; SQLite writes one transaction at a time)."""
    return (
        trajectory.steps.select_for_update(of=("self",))
        .select_related("call", "trajectory")
        .order_by("position", "pk")
    )


def _rewarded_step(
    step: Step,
    *,
    before: list[dict[str, Any]],
    results: list[dict[str, Any]],
    reward: float,
    preferred: bool,
) -> RewardedStep:
    """The step as memory keeps it (its turns from `step_turns`: the conversation `before`
    it, the tool `results` its calls got), redacted as a reviewed capture is: the texts, the
    tool calls' arguments and the tool results (REDACTION: off keeps all)."""
    return RewardedStep(
        step_id=step.pk,
        input_text=scrub(step.decision_point, into="review"),
        action_text=scrub(step.action_text, into="review"),
        tool_calls=scrub(step.tool_calls, into="review"),
        conversation=before,
        tool_names=step_tool_names(step),
        output_format=signatures.output_format(step.call.options if step.call is not None else {}),
        reward=reward,
        preferred=preferred,
        results=results,
    )


def _corrects_a_step(feedback: Feedback) -> bool:
    return feedback.step_id is not None and bool(feedback.corrected_action)


def corrected_calls(action: dict[str, Any]) -> list[dict[str, Any]]:
    """A correction's tool calls as a step keeps them (an id each: the API leaves it
    optional)."""
    return [
        {
            "id": call.get("id") or f"call_correction_{number}",
            "type": "function",
            "function": {
                "name": call["function"]["name"],
                "arguments": call["function"].get("arguments") or "{}",
            },
        }
        for number, call in enumerate(action.get("tool_calls") or [])
    ]


def correction_apply(*, queue: Queue, feedback: Feedback) -> list[Example]:
    """An application's correction of a step, under the queue's reward rule (none: nothing):
    the corrected action becomes the step's preferred example (the turns before the step,
    then the corrected action, with the step's tools) and the action the gateway served its
    rejected rival, with the feedback's reward. Both are redacted as rewarded steps are. A
    later correction of the step replaces this one; the same one again stores nothing."""
    learnt = learnt_reward(reward=feedback.reward, success=feedback.success)
    if queue.reward_threshold is None or learnt is None or not _corrects_a_step(feedback):
        return []
    turns = next(
        each
        for each in step_turns(_locked_steps(feedback.trajectory), _for_memory)
        if each.step.pk == feedback.step_id
    )
    served = _rewarded_step(
        turns.step, before=turns.before, results=turns.results, reward=learnt, preferred=False
    )
    action = scrub(feedback.corrected_action, into="review")
    corrected = replace(
        served,
        action_text=str(action.get("content") or ""),
        tool_calls=corrected_calls(action),
        reward=PREFERRED_REWARD,
        preferred=True,
        results=[],  # what the corrected calls would have returned is not known
    )
    return step_correction_record(
        queue_id=queue.pk,
        correction=StepCorrection(
            feedback_id=feedback.pk,
            feedback_at=feedback.created_at,
            corrected=corrected,
            served=served,
        ),
    )
