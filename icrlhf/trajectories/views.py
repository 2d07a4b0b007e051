"""A queue's trajectories: the list, and one run's timeline. Like the call log, for the
queue's reviewers and curators (viewers see figures, not what end users wrote)."""

import uuid

from django.contrib import messages
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from icrlhf.queues.access import queue_for_member, review_check
from icrlhf.trajectories.feedback import feedback_record
from icrlhf.trajectories.models import Trajectory
from icrlhf.trajectories.rewards import ApprovalConflict, RunSeen, rewards_approval_decide
from icrlhf.trajectories.selectors import (
    PAGE_SIZE,
    approval_report,
    low_reward_captures_of,
    repeated_calls_of,
    reviewer_key,
    run_summary,
    steps_of,
    trajectories_recent,
)


def trajectory_list(request: HttpRequest, slug: str) -> HttpResponse:
    queue = queue_for_member(request.user, slug=slug)
    review_check(request.user, queue)  # what end users wrote: reviewers and curators only
    outcome = request.GET.get("outcome")
    if outcome not in Trajectory.Outcome.values:
        outcome = None
    awaiting = request.GET.get("approval") == Trajectory.Approval.PENDING
    found = trajectories_recent(queue=queue, outcome=outcome, awaiting_approval=awaiting)
    page = Paginator(found, PAGE_SIZE).get_page(request.GET.get("page"))
    filtered = outcome is not None or awaiting
    context = {
        "queue": queue,
        "page": page,
        "outcome": outcome,
        "awaiting": awaiting,
        "outcomes": Trajectory.Outcome.choices,
        # An empty filter says how many runs there are in all ("No trajectories yet" is
        # for a queue that has none).
        "total": trajectories_recent(queue=queue).count() if filtered else page.paginator.count,
    }
    return render(request, "trajectories/list.html", context)


def trajectory_detail(request: HttpRequest, slug: str, trajectory_id: uuid.UUID) -> HttpResponse:
    queue = queue_for_member(request.user, slug=slug)
    review_check(request.user, queue)
    trajectory = get_object_or_404(
        Trajectory.objects.select_related("queue", "token", "approved_by"),
        pk=trajectory_id,
        queue=queue,
    )
    steps = list(steps_of(trajectory))
    repeated = repeated_calls_of(steps)
    context = {
        "queue": queue,
        "trajectory": trajectory,
        "summary": run_summary(trajectory),
        "steps": steps,
        # Each step with the earlier call it repeats after its result, if it does (a loop).
        "timeline": [(step, repeated.get(step.pk)) for step in steps],
        "feedback": trajectory.feedback.order_by("created_at", "pk"),
        "captures": low_reward_captures_of(trajectory),
    }
    return render(request, "trajectories/detail.html", context)


@require_POST
def trajectory_approval(request: HttpRequest, slug: str, trajectory_id: uuid.UUID) -> HttpResponse:
    """A reviewer approves a rewarded run into memory, or declines it."""
    queue = queue_for_member(request.user, slug=slug)
    review_check(request.user, queue)
    decision = request.POST.get("decision")
    trajectory = get_object_or_404(
        Trajectory.objects.select_related("queue"), pk=trajectory_id, queue=queue
    )
    if decision not in ("approve", "decline"):
        messages.error(request, "Choose Approve into memory or Decline.")
        return redirect("trajectories:detail", slug, trajectory_id)
    seen = RunSeen(
        step_ids=frozenset(int(pk) for pk in request.POST.getlist("seen_step") if pk.isdigit()),
        feedback_ids=frozenset(request.POST.getlist("seen_feedback")),
    )
    try:
        stored = rewards_approval_decide(
            queue=queue,
            trajectory_id=trajectory_id,
            reviewer=request.user,  # type: ignore[arg-type]  # review_check: logged in
            approve=decision == "approve",
            seen=seen,
        )
    except ApprovalConflict as conflict:
        messages.error(request, str(conflict))
    else:
        if decision == "approve":
            messages.success(request, approval_report(trajectory=trajectory, stored=stored))
        else:
            trajectory.refresh_from_db()
            messages.success(request, run_summary(trajectory).memory_line)
    return redirect("trajectories:detail", slug, trajectory_id)


@require_POST
def trajectory_outcome(request: HttpRequest, slug: str, trajectory_id: uuid.UUID) -> HttpResponse:
    """A reviewer says how the run ended: recorded as feedback from a person (success, and a
    comment naming them), so the queue's reward rule treats it as the application's."""
    queue = queue_for_member(request.user, slug=slug)
    review_check(request.user, queue)
    trajectory = get_object_or_404(Trajectory, pk=trajectory_id, queue=queue)
    outcome = request.POST.get("outcome")
    if outcome not in (Trajectory.Outcome.SUCCEEDED, Trajectory.Outcome.FAILED):
        messages.error(request, "Choose Succeeded or Failed.")
        return redirect("trajectories:detail", slug, trajectory_id)
    feedback_record(
        queue=queue,
        token=None,
        call_id=None,
        trajectory_ref=str(trajectory.pk),
        reward=None,
        success=outcome == Trajectory.Outcome.SUCCEEDED,
        comment=f"Outcome set by {request.user.get_username()}.",
        key=reviewer_key(request.user.pk),  # type: ignore[arg-type]  # review_check: logged in
    )
    trajectory.refresh_from_db()
    summary = run_summary(trajectory)
    messages.success(request, f"Outcome set: {outcome}. Memory: {summary.memory_line}")
    return redirect("trajectories:detail", slug, trajectory_id)
