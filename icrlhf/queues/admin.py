from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from icrlhf.queues.admin_scope import QueueScopedAdmin
from icrlhf.queues.models import Item, Queue
from icrlhf.queues.services import queue_save


@admin.register(Queue)
class QueueAdmin(QueueScopedAdmin[Queue]):
    queue_lookup = "pk"
    list_display = ["name", "slug", "kind", "n_candidates", "k_examples", "model"]
    prepopulated_fields = {"slug": ["name"]}
    search_fields = ["name", "slug"]
    filter_horizontal = ["members"]
    readonly_fields = ["guidelines_version"]

    def save_model(self, request: HttpRequest, obj: Queue, form: Any, change: bool) -> None:
        queue_save(queue=obj, actor=request.user)  # type: ignore[arg-type]


@admin.register(Item)
class ItemAdmin(QueueScopedAdmin[Item]):
    list_display = ["pk", "queue", "status", "source", "created_at"]
    list_filter = ["queue", "status", "source"]
    search_fields = ["input_text", "external_id"]
    readonly_fields = ["created_by", "created_at", "updated_at"]
