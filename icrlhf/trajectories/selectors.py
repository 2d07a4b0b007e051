"""What the trajectory pages show."""

from django.db.models import QuerySet

from icrlhf.queues.models import Queue
from icrlhf.trajectories.models import Step, Trajectory

PAGE_SIZE = 50


def trajectories_recent(*, queue: Queue, outcome: str | None = None) -> QuerySet[Trajectory]:
    """The queue's trajectories, the latest step first (optionally of one outcome)."""
    found = Trajectory.objects.filter(queue=queue)
    if outcome is not None:
        found = found.filter(outcome=outcome)
    return found


def steps_of(trajectory: Trajectory) -> QuerySet[Step]:
    return trajectory.steps.select_related("call").order_by("position", "pk")
