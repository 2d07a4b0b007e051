from django.contrib import admin

from icrlhf.queues.admin_scope import QueueScopedAdmin
from icrlhf.review.models import AutomationPause, Decision


@admin.register(Decision)
class DecisionAdmin(QueueScopedAdmin[Decision]):
    """Read-only: decisions are append-only."""

    queue_lookup = "item__queue"
    list_display = ["pk", "item", "verdict", "reviewer", "created_at"]
    list_filter = ["verdict", "item__queue"]
    readonly_fields = [field.name for field in Decision._meta.fields]

    def has_add_permission(self, request: object) -> bool:
        return False

    def has_change_permission(self, request: object, obj: object = None) -> bool:
        return False


@admin.register(AutomationPause)
class AutomationPauseAdmin(QueueScopedAdmin[AutomationPause]):
    """Read-only: a pause is the test's record; curators resume on the routing page."""

    queue_lookup = "queue"
    list_display = ["queue", "paused_at", "target", "audits", "agreed", "resumed_at"]
    list_filter = ["queue"]
    readonly_fields = [field.name for field in AutomationPause._meta.fields]

    def has_add_permission(self, request: object) -> bool:
        return False

    def has_change_permission(self, request: object, obj: object = None) -> bool:
        return False
