"""The queue's reward rule: rewarded steps become memory, preferred at or above the queue's
threshold and rejected below it (the icrl library stores only verified successes; a reward
below the bar teaches what not to do)."""

from typing import Any

from django.conf import settings

from icrlhf.integrations.redaction import redact
from icrlhf.memory import signatures
from icrlhf.memory.models import Example
from icrlhf.memory.services import RewardedStep, rewarded_steps_record
from icrlhf.queues.models import Queue
from icrlhf.trajectories.models import Step, Trajectory


def _action_message(step: Step) -> dict[str, Any]:
    if step.tool_calls:
        return {"role": "assistant", "content": None, "tool_calls": step.tool_calls}
    return {"role": "assistant", "content": step.action_text}


def _tool_names(step: Step, trajectory: Trajectory) -> list[str]:
    """The tools this step's call offered (a run may change them between calls)."""
    if step.call is None:
        return [str(name) for name in trajectory.tool_names]
    return signatures.tool_names(step.call.options.get("tools"))


def _redacted(message: dict[str, Any]) -> dict[str, Any]:
    content = message.get("content")
    return {**message, "content": redact(content).text} if isinstance(content, str) else message


def rewards_apply(
    *, queue: Queue, trajectory: Trajectory, reward: float, step: Step | None = None
) -> list[Example]:
    """Store the run's steps (or the one step) with `reward`, under the queue's rule; nothing
    when the queue has none."""
    if queue.reward_threshold is None:
        return []
    preferred = reward >= queue.reward_threshold
    rewarded: list[RewardedStep] = []
    conversation: list[dict[str, Any]] = []
    # Locked: two feedbacks on one run at once store its steps once (PostgreSQL; SQLite
    # writes one transaction at a time).
    steps = list(
        trajectory.steps.select_for_update(of=("self",))
        .select_related("call")
        .order_by("position", "pk")
    )
    # What memory keeps is redacted, as a reviewed capture is (REDACTION: off keeps all).
    clean = _redacted if settings.REDACTION != "off" else (lambda message: message)
    for each, following in zip(steps, [*steps[1:], None], strict=True):
        conversation += [clean(m) for m in each.observation]
        if step is None or each.pk == step.pk:
            answered = {call.get("id") for call in each.tool_calls}
            results = [
                clean(m)
                for m in (following.observation if following is not None else [])
                if m.get("role") == "tool" and m.get("tool_call_id") in answered
            ]
            rewarded.append(
                RewardedStep(
                    step_id=each.pk,
                    input_text=clean({"content": each.decision_point})["content"],
                    action_text=clean({"content": each.action_text})["content"],
                    tool_calls=each.tool_calls,
                    conversation=list(conversation),
                    tool_names=_tool_names(each, trajectory),
                    output_format=signatures.output_format(
                        each.call.options if each.call is not None else {}
                    ),
                    reward=reward,
                    preferred=preferred,
                    results=results,
                )
            )
        conversation.append(clean(_action_message(each)))
    return rewarded_steps_record(queue_id=queue.pk, steps=rewarded)
