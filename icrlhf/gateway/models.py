import uuid

from django.db import models
from django.utils import timezone

from icrlhf.ingest.models import IntegrationToken
from icrlhf.integrations import llm
from icrlhf.queues.models import Item, Queue


class Call(models.Model):
    """One call an application made to the gateway: what shaped its answer, and how long
    each part took. Written once the answer has been sent (a stream: once it ended)."""

    class Source(models.TextChoices):
        MODEL = "model", "model"
        MEMORY = "memory", "memory"

    class Memory(models.TextChoices):
        USED = "used", "examples retrieved"
        EMPTY = "empty", "nothing similar stored"
        UNAVAILABLE = "unavailable", "memory unavailable"

    class Capture(models.TextChoices):
        NONE = "", "not captured"
        SAMPLED = "sampled", "sampled"
        UNCOVERED = "uncovered", "not covered by memory"
        LOW_REWARD = "low_reward", "its run was rewarded below the bar"
        DUPLICATE = "duplicate", "identical to a recent capture"
        REMOVED = "removed", "its review item was deleted"

    # Chosen before the answer is sent, so the response headers can name the call.
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    queue = models.ForeignKey(Queue, on_delete=models.CASCADE, related_name="calls")
    token = models.ForeignKey(IntegrationToken, null=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(default=timezone.now)
    source = models.CharField(max_length=10, choices=Source.choices)
    memory = models.CharField(max_length=12, choices=Memory.choices)
    stream = models.BooleanField(default=False)
    status_code = models.PositiveSmallIntegerField(default=200)
    error = models.CharField(max_length=500, blank=True)
    request_text = models.TextField(
        help_text="The decision point: the last user message, or the goal and the latest tool "
        "result. The retrieval query."
    )
    # The caller's messages as sent upstream, the last one included (older rows: all but
    # the last), so that a captured call's candidates answer the same conversation.
    context = models.JSONField(default=list, blank=True)
    # The caller's tool and output fields (tools, tool_choice, response_format, …).
    options = models.JSONField(default=dict, blank=True)
    # SHA-256 of the whole conversation: identical requests are captured once.
    request_hash = models.CharField(max_length=64, blank=True)
    answer_text = models.TextField(blank=True)
    # The answer's tool calls, in OpenAI's shape (answer_text is then their text rendering).
    tool_calls = models.JSONField(default=list, blank=True)
    # [{"id": example uuid, "score": cosine}], in prompt order; a memory answer names its one.
    examples = models.JSONField(default=list, blank=True)
    top_score = models.FloatField(null=True, blank=True)
    model = models.CharField(max_length=200, blank=True)
    # The number of the queue's playbook version its prompt carried (none: no playbook, or
    # memory answered).
    playbook_version = models.PositiveIntegerField(null=True, blank=True)
    retrieval_ms = models.PositiveIntegerField(null=True, blank=True)
    upstream_ms = models.PositiveIntegerField(null=True, blank=True)
    total_ms = models.PositiveIntegerField(null=True, blank=True)
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    # Where the upstream's time went, where its server reports it (llama.cpp does): the model
    # reading the prompt, and writing the answer; `waited_ms` is the rest.
    model_prompt_ms = models.PositiveIntegerField(null=True, blank=True)
    model_generation_ms = models.PositiveIntegerField(null=True, blank=True)
    cached_prompt_tokens = models.PositiveIntegerField(
        default=0, help_text="Prompt tokens the upstream reused from its cache."
    )
    asks = models.PositiveSmallIntegerField(
        default=1, help_text="Upstream calls made: 2 when the model named a tool not offered."
    )
    # Answered without memory to measure what memory is worth (the queue's holdout share).
    holdout = models.BooleanField(default=False)
    # An answer the confidence rule served from memory: its memory-only confidence. The
    # automation's audits do not watch these; reviewing captured calls does.
    memory_confidence = models.FloatField(null=True, blank=True)
    # Why it goes to review, and the review item it became (none yet: the sweeper retries).
    capture = models.CharField(max_length=10, choices=Capture.choices, blank=True, default="")
    item = models.ForeignKey(
        Item, null=True, blank=True, on_delete=models.SET_NULL, related_name="calls"
    )

    class Meta:
        ordering = ["-created_at", "-pk"]
        indexes = [
            models.Index(fields=["queue", "created_at"]),
            models.Index(
                fields=["created_at"],
                condition=models.Q(item__isnull=True) & ~models.Q(capture=""),
                name="call_capture_pending",
            ),
        ]

    def __str__(self) -> str:
        return f"call {self.pk} to {self.queue} ({self.source})"

    @property
    def waited_ms(self) -> int | None:
        """The upstream's time before its model started on the call: waiting for a free slot
        on its server, and the network; None where the server reports no times."""
        if None in (self.upstream_ms, self.model_prompt_ms, self.model_generation_ms):
            return None
        model_ms = (self.model_prompt_ms or 0) + (self.model_generation_ms or 0)
        return max(0, (self.upstream_ms or 0) - model_ms)

    @property
    def error_summary(self) -> str:
        """The error without the upstream's own words, for everyone but admins."""
        return llm.error_summary(self.error)
