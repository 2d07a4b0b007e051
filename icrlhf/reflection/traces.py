"""What the reflector reads, each as a dual trace, redacted and clipped: decisions where the
queue's first candidate lost (the answers reviewers rejected beside the one they preferred,
with their reasons), and agents' runs with a step rewarded low or corrected (those steps
beside the run's accepted ones, with the correction and the application's comment)."""

from collections.abc import Collection
from dataclasses import dataclass

from django.db.models import Q

from icrlhf.generation.models import Candidate
from icrlhf.integrations.redaction import redact
from icrlhf.memory.signatures import action_text
from icrlhf.queues.models import Queue
from icrlhf.review.models import Decision
from icrlhf.trajectories.models import Feedback, Step, Trajectory
from icrlhf.trajectories.selectors import APPROVAL_ALLOWS_MEMORY, low_reward_q

# Enough of an answer to see what it does; a batch of ten stays within a small model's window.
TEXT_MAX_CHARS = 400
RIVALS_MAX = 2
# A run's steps shown: its weak ones first, then the accepted ones nearest them.
RUN_STEPS_MAX = 6


@dataclass(frozen=True)
class DualTrace:
    decision_id: int
    request: str
    rejected: list[str]  # the ranking's first first
    preferred: str  # "" when none was acceptable
    verdict: str
    reasons: list[str]
    comment: str


def _clip(text: str) -> str:
    text = redact(" ".join(text.split())).text
    return text if len(text) <= TEXT_MAX_CHARS else text[: TEXT_MAX_CHARS - 1] + "…"


def losing_decisions(queue: Queue, *, read: Collection[int], limit: int) -> list[Decision]:
    """The queue's standing decisions not read by an earlier reflection (`read`: their ids)
    whose first candidate (the ranking's) was not taken as it was, newest first: a backlog is
    read a batch at a time, newest first."""
    found = Decision.objects.standing().filter(item__queue=queue).first_taken(False)
    return list(found.exclude(pk__in=list(read)).select_related("item").order_by("-pk")[:limit])


def dual_traces(decisions: list[Decision]) -> list[DualTrace]:
    answers: dict[int, list[Candidate]] = {}
    for candidate in Candidate.objects.filter(
        generation_id__in=[d.generation_id for d in decisions], status=Candidate.Status.DONE
    ).order_by("rank", "position"):
        answers.setdefault(candidate.generation_id, []).append(candidate)
    traces = []
    for decision in decisions:
        rivals = [
            c.text
            for c in answers.get(decision.generation_id, [])
            if c.pk != decision.chosen_candidate_id or decision.verdict == Decision.Verdict.EDITED
        ]
        traces.append(
            DualTrace(
                decision_id=decision.pk,
                request=_clip(decision.item.input_text),
                rejected=[_clip(text) for text in rivals[:RIVALS_MAX]],
                preferred=_clip(decision.final_text),
                verdict=decision.verdict,
                reasons=list(decision.reason_tags),
                comment=_clip(decision.comment),
            )
        )
    return traces


@dataclass(frozen=True)
class StepLine:
    position: int
    action: str
    reward: float | None
    weak: bool  # rewarded below the queue's bar, or corrected
    correction: str  # the action that would have been right ("" none)
    comment: str


@dataclass(frozen=True)
class RunTrace:
    run_id: str
    goal: str
    steps: list[StepLine]
    steps_hidden: int
    outcome: str  # "succeeded", "failed" or ""
    reward: float | None


def weak_steps_q(queue: Queue) -> Q:
    """Steps corrected by feedback, or rewarded below the queue's bar (its reward rule's
    threshold; without one, only runs reported failed count as low)."""
    if queue.reward_threshold is None:
        low = Q(trajectory__outcome=Trajectory.Outcome.FAILED)
    else:
        low = low_reward_q("", queue.reward_threshold)
    corrected = (
        Feedback.objects.filter(queue=queue, step__isnull=False)
        .exclude(corrected_action={})
        .values("step_id")
    )
    return low | Q(pk__in=corrected)


def weak_runs(queue: Queue, *, read: Collection[str], limit: int) -> list[Trajectory]:
    """The queue's runs not read by an earlier reflection (`read`: their ids), newest first,
    that a reviewer has not kept out of memory and that have a weak step."""
    runs = Step.objects.filter(
        trajectory__queue=queue, trajectory__approval__in=APPROVAL_ALLOWS_MEMORY
    ).filter(weak_steps_q(queue))
    return list(
        Trajectory.objects.filter(pk__in=runs.values("trajectory_id"))
        .exclude(pk__in=list(read))
        .order_by("-last_step_at", "-pk")[:limit]
    )


def run_traces(queue: Queue, runs: list[Trajectory]) -> list[RunTrace]:
    steps = list(Step.objects.filter(trajectory__in=runs).order_by("trajectory", "position", "pk"))
    weak = set(
        Step.objects.filter(pk__in=[s.pk for s in steps])
        .filter(weak_steps_q(queue))
        .values_list("pk", flat=True)
    )
    said: dict[int, Feedback] = {}  # each step's latest feedback with a correction or comment
    for feedback in Feedback.objects.filter(step__in=steps).order_by("created_at", "pk"):
        if feedback.corrected_action or feedback.comment:
            said[feedback.step_id] = feedback  # type: ignore[index]
    by_run: dict[str, list[Step]] = {}
    for step in steps:
        by_run.setdefault(str(step.trajectory_id), []).append(step)
    traces = []
    for run in runs:
        own = by_run.get(str(run.pk), [])
        weak_first = sorted(own, key=lambda s: (s.pk not in weak, s.position))
        shown = sorted(weak_first[:RUN_STEPS_MAX], key=lambda s: s.position)
        lines = [_step_line(step, weak=step.pk in weak, said=said.get(step.pk)) for step in shown]
        traces.append(
            RunTrace(
                run_id=str(run.pk),
                goal=_clip(run.goal),
                steps=lines,
                steps_hidden=len(own) - len(shown),
                outcome=run.outcome,
                reward=run.reward,
            )
        )
    return traces


def _step_line(step: Step, *, weak: bool, said: Feedback | None) -> StepLine:
    correction = said.corrected_action if said else {}
    return StepLine(
        position=step.position,
        action=_clip(action_text(step.action_text, step.tool_calls)),
        reward=step.reward,
        weak=weak,
        correction=_clip(
            action_text(
                str(correction.get("content") or ""), list(correction.get("tool_calls") or [])
            )
        )
        if correction
        else "",
        comment=_clip(said.comment) if said else "",
    )
