from django.contrib import admin

from icrlhf.queues.models import Item, Queue


@admin.register(Queue)
class QueueAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ["name", "slug", "kind", "n_candidates", "k_examples", "model"]
    prepopulated_fields = {"slug": ["name"]}
    search_fields = ["name", "slug"]


@admin.register(Item)
class ItemAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ["pk", "queue", "status", "source", "created_at"]
    list_filter = ["queue", "status", "source"]
    search_fields = ["input_text", "external_id"]
    readonly_fields = ["created_by", "created_at", "updated_at"]
