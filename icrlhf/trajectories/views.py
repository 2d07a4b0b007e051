"""A queue's trajectories: the list, and one run's timeline. Like the call log, for the
queue's reviewers and curators (viewers see figures, not what end users wrote)."""

import uuid

from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render

from icrlhf.queues.access import queue_for_member, review_check
from icrlhf.trajectories.models import Trajectory
from icrlhf.trajectories.selectors import PAGE_SIZE, steps_of, trajectories_recent


def trajectory_list(request: HttpRequest, slug: str) -> HttpResponse:
    queue = queue_for_member(request.user, slug=slug)
    review_check(request.user, queue)  # what end users wrote: reviewers and curators only
    outcome = request.GET.get("outcome")
    if outcome not in Trajectory.Outcome.values:
        outcome = None
    page = Paginator(trajectories_recent(queue=queue, outcome=outcome), PAGE_SIZE).get_page(
        request.GET.get("page")
    )
    context = {
        "queue": queue,
        "page": page,
        "outcome": outcome,
        "outcomes": Trajectory.Outcome.choices,
    }
    return render(request, "trajectories/list.html", context)


def trajectory_detail(request: HttpRequest, slug: str, trajectory_id: uuid.UUID) -> HttpResponse:
    queue = queue_for_member(request.user, slug=slug)
    review_check(request.user, queue)
    trajectory = get_object_or_404(Trajectory, pk=trajectory_id, queue=queue)
    context = {"queue": queue, "trajectory": trajectory, "steps": steps_of(trajectory)}
    return render(request, "trajectories/detail.html", context)
