"""What the trajectory pages show."""

from dataclasses import dataclass

from django.db.models import Expression, F, Q, QuerySet

from icrlhf.queues.models import Queue
from icrlhf.trajectories.models import Step, Trajectory

PAGE_SIZE = 50
# Runs whose feedback may have effects: no approval asked, or a reviewer approved.
APPROVAL_ALLOWS_MEMORY = (Trajectory.Approval.NOT_NEEDED, Trajectory.Approval.APPROVED)


def low_reward_q(step: str, bar: Expression | F | float) -> Q:
    """Steps (reached through the `step` prefix, e.g. "step__" from a call, "" from a Step)
    rewarded below `bar`: their own reward, their run's, or a run reported failed."""
    return (
        Q(**{f"{step}reward__lt": bar})
        | Q(**{f"{step}trajectory__reward__lt": bar})
        | Q(
            **{
                f"{step}trajectory__reward__isnull": True,
                f"{step}trajectory__outcome": Trajectory.Outcome.FAILED,
            }
        )
    )


@dataclass(frozen=True)
class LowRewardCaptures:
    low: int  # steps rewarded below the bar (with a call to review)
    sent: int  # of them, sent to review
    cap: int

    @property
    def cut(self) -> bool:
        """The queue's cap per run left some of them out."""
        return self.low > self.sent and self.sent >= self.cap


def low_reward_captures_of(trajectory: Trajectory) -> LowRewardCaptures | None:
    """How many of the run's low-reward steps went to review, where the queue sends them."""
    queue = trajectory.queue
    if not queue.capture_low_reward or queue.reward_threshold is None:
        return None
    steps = trajectory.steps.filter(call__isnull=False, call__status_code=200)
    low = steps.filter(low_reward_q("", queue.reward_threshold))
    return LowRewardCaptures(
        low=low.count(),
        sent=steps.filter(call__capture="low_reward").count(),
        cap=queue.low_reward_captures_per_run,
    )


def trajectories_recent(
    *, queue: Queue, outcome: str | None = None, awaiting_approval: bool = False
) -> QuerySet[Trajectory]:
    """The queue's trajectories, the latest step first (optionally of one outcome, or those
    awaiting a reviewer's approval)."""
    found = Trajectory.objects.filter(queue=queue)
    if outcome is not None:
        found = found.filter(outcome=outcome)
    if awaiting_approval:
        found = found.filter(approval=Trajectory.Approval.PENDING)
    return found


def steps_of(trajectory: Trajectory) -> QuerySet[Step]:
    """The run's steps in order, each with its call and the examples memory keeps of it."""
    return (
        trajectory.steps.select_related("call")
        .prefetch_related("examples")
        .order_by("position", "pk")
    )
