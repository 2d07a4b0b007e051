"""What the trajectory pages show."""

from django.db.models import QuerySet

from icrlhf.queues.models import Queue
from icrlhf.trajectories.models import Step, Trajectory

PAGE_SIZE = 50


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
