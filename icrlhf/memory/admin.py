from django.contrib import admin

from icrlhf.memory.models import Example


@admin.register(Example)
class ExampleAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ["pk", "queue", "role", "reward", "status", "index_state", "created_at"]
    list_filter = ["queue", "role", "status", "index_state"]
    search_fields = ["input_text", "output_text"]
    readonly_fields = [
        "decision",
        "candidate",
        "times_retrieved",
        "times_accepted",
        "utility",
        "index_state",
        "index_error",
        "embedding_model",
        "indexed_at",
        "created_at",
    ]
