from django.contrib import admin

from icrlhf.generation.models import Candidate, Generation
from icrlhf.queues.admin_scope import QueueScopedAdmin


class CandidateInline(admin.TabularInline[Candidate, Generation]):
    model = Candidate
    extra = 0
    can_delete = False
    fields = ("position", "status", "text", "error", "attempts", "latency_ms", "model")
    readonly_fields = fields


@admin.register(Generation)
class GenerationAdmin(QueueScopedAdmin[Generation]):
    queue_lookup = "item__queue"
    list_display = ["pk", "item", "status", "model", "n_candidates", "created_at", "finished_at"]
    list_filter = ["status", "model"]
    inlines = [CandidateInline]
    readonly_fields = [field.name for field in Generation._meta.fields]
