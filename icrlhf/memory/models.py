import uuid

from django.conf import settings
from django.db import models

from icrlhf.queues.models import Queue

# Memory sits below generation and review in the layers (pyproject's import-linter contract):
# it references their rows by the lazy "app.Model" form, so its code never imports theirs.


class Example(models.Model):
    """A rewarded trajectory kept as memory. Its UUID is also its point id in the vector store."""

    class Role(models.TextChoices):
        PREFERRED = "preferred", "Preferred"
        REJECTED = "rejected", "Rejected"

    class Status(models.TextChoices):
        ACTIVE = "active", "Active"
        PINNED = "pinned", "Pinned"
        RETIRED = "retired", "Retired"

    class IndexState(models.TextChoices):
        PENDING = "pending", "Pending"
        INDEXED = "indexed", "Indexed"
        FAILED = "failed", "Failed"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    queue = models.ForeignKey(Queue, on_delete=models.CASCADE, related_name="examples")
    # Where it was learnt: a reviewer's decision, or an agent's step that the application
    # rewarded or corrected (feedback, through the queue's reward rule).
    decision = models.ForeignKey(
        "review.Decision",
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="examples",
    )
    # RESTRICT: a run whose steps are memory is not deleted around curation (its examples are
    # retired or deleted through curation first); a queue's deletion takes both.
    step = models.ForeignKey(
        "trajectories.Step",
        null=True,
        blank=True,
        on_delete=models.RESTRICT,
        related_name="examples",
    )
    # A step's example learnt from an application's correction (feedback with a
    # corrected_action): the corrected action preferred, the served one rejected. A later
    # correction of the step replaces these (trajectories/rewards.py, correction_apply).
    feedback = models.ForeignKey(
        "trajectories.Feedback",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="examples",
    )
    candidate = models.ForeignKey(
        "generation.Candidate",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="examples",
        help_text="The candidate this output came from (for an edit: the one edited).",
    )
    input_text = models.TextField()
    output_text = models.TextField()
    # An agent's step: its signature (the tools offered and the output format required when
    # it was made) and its OpenAI turns (the conversation before the action, the action with
    # its tool calls, then their results where known). Plain examples have none of these.
    tool_names = models.JSONField(default=list, blank=True)
    output_format = models.JSONField(default=dict, blank=True)
    turns = models.JSONField(default=list, blank=True)
    reward = models.FloatField()
    role = models.CharField(max_length=10, choices=Role.choices)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.ACTIVE)
    weight = models.FloatField(
        default=1.0, help_text="Multiplies the similarity when examples are ranked (0–10)."
    )
    # Usage, counted when an item whose prompt carried this example is decided.
    times_retrieved = models.PositiveIntegerField(default=0)
    times_accepted = models.PositiveIntegerField(default=0)
    utility = models.FloatField(
        default=0.5, help_text="Smoothed acceptance rate: (accepted + 1) / (retrieved + 2)."
    )
    last_retrieved_at = models.DateTimeField(null=True, blank=True)
    retired_reason = models.CharField(max_length=300, blank=True)
    retired_at = models.DateTimeField(null=True, blank=True)
    # Computed by the worker after indexing: the closest other examples of the queue.
    similar = models.JSONField(default=list, blank=True)
    duplicate_of = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="duplicates",
        help_text="An older preferred example this one nearly repeats (cosine above 0.95).",
    )
    index_state = models.CharField(
        max_length=10, choices=IndexState.choices, default=IndexState.PENDING
    )
    index_error = models.TextField(blank=True)
    embedding_model = models.CharField(max_length=200, blank=True)
    indexed_at = models.DateTimeField(null=True, blank=True)
    # A curator's approval for serving this answer as is, where the queue asks for one.
    approved_for_answers_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["index_state", "created_at"]),
            # Retrieval asks for a queue's pinned examples on every call (the gateway's hot
            # path): without this, a scan of the queue's examples, ~7 ms at 10k on SQLite.
            models.Index(fields=["queue", "role", "status"]),
        ]

    def __str__(self) -> str:
        return f"{self.get_role_display()} example {self.pk}"


class Retrieval(models.Model):
    """An example retrieved into a generation's prompt, with its similarity and rank."""

    generation = models.ForeignKey(
        "generation.Generation", on_delete=models.CASCADE, related_name="retrievals"
    )
    example = models.ForeignKey(Example, on_delete=models.CASCADE, related_name="retrievals")
    score = models.FloatField()
    rank = models.PositiveSmallIntegerField()
    # A format example (another tool set's call, showing the form of one): never credited.
    format_only = models.BooleanField(default=False)

    class Meta:
        ordering = ["rank"]
        constraints = [
            models.UniqueConstraint(fields=["generation", "example"], name="retrieval_unique"),
        ]

    def __str__(self) -> str:
        return f"Example {self.example_id} at rank {self.rank} of generation {self.generation_id}"


class CurationEvent(models.Model):
    """Who changed what in the memory, and when. Written by every curation service."""

    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        help_text="Empty for the automatic pruning.",
    )
    action = models.CharField(max_length=30)
    example_id = models.UUIDField(db_index=True)
    queue = models.ForeignKey(Queue, on_delete=models.CASCADE, related_name="curation_events")
    detail = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        who = self.actor or "automatic pruning"
        return f"{self.action} of {self.example_id} by {who}"
