"""Trajectories in the admin, scoped to the queues a staff member belongs to; curators of a
queue may set a trajectory's outcome and delete it."""

from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html
from django.utils.text import Truncator

from icrlhf.queues.admin_scope import QueueScopedAdmin
from icrlhf.trajectories.models import Step, Trajectory


class StepInline(admin.TabularInline[Step, Trajectory]):
    model = Step
    extra = 0
    can_delete = False
    fields = ("position", "created_at", "decision_point", "action_text", "tool_calls")
    readonly_fields = ("position", "created_at", "decision_point", "action_text", "tool_calls")

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Trajectory)
class TrajectoryAdmin(QueueScopedAdmin[Trajectory]):
    curators_manage = True
    list_display = [
        "goal_short",
        "queue",
        "step_count",
        "outcome",
        "reward",
        "approval",
        "last_step_at",
    ]
    list_filter = ["queue", "outcome", "approval", "grouping"]
    search_fields = ["goal", "key"]
    date_hierarchy = "last_step_at"
    readonly_fields = [
        "timeline",
        "queue",
        "key",
        "grouping",
        "goal",
        "tool_names",
        "created_at",
        "last_step_at",
        "step_count",
        # Approval is decided on the run's page, where its steps are read first.
        "approval",
        "approved_by",
        "approved_at",
    ]
    fields = [*readonly_fields, "outcome", "reward"]
    inlines = [StepInline]

    def has_add_permission(self, request: HttpRequest, *args: Any) -> bool:
        return False  # trajectories come from the gateway's calls

    @admin.display(description="goal")
    def goal_short(self, trajectory: Trajectory) -> str:
        return Truncator(trajectory.goal).chars(80)

    @admin.display(description="timeline")
    def timeline(self, trajectory: Trajectory) -> str:
        url = reverse("trajectories:detail", args=[trajectory.queue.slug, trajectory.pk])
        return format_html('<a href="{}">The steps, as the queue\'s members see them</a>', url)
