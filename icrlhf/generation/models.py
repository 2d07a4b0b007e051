from django.db import models

from icrlhf.queues.models import Item


class Generation(models.Model):
    """One best-of-N run for an item: what was sent to the model and what it retrieved."""

    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        PREPARING = "preparing", "Retrieving examples"
        RUNNING = "running", "Generating"
        DONE = "done", "Done"
        FAILED = "failed", "Failed"

    item = models.ForeignKey(Item, on_delete=models.CASCADE, related_name="generations")
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.PENDING)
    model = models.CharField(max_length=200)
    api_base = models.CharField(max_length=500, blank=True)
    params = models.JSONField(default=dict)
    n_candidates = models.PositiveSmallIntegerField()
    messages = models.JSONField(default=list, help_text="The exact messages sent to the model.")
    retrieval_error = models.TextField(blank=True)
    retrieval_ms = models.PositiveIntegerField(null=True, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    prepared_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        get_latest_by = "created_at"

    def __str__(self) -> str:
        return f"Generation {self.pk} of item {self.item_id}"

    @property
    def is_finished(self) -> bool:
        return self.status in {self.Status.DONE, self.Status.FAILED}


class Candidate(models.Model):
    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        RUNNING = "running", "Running"
        DONE = "done", "Done"
        FAILED = "failed", "Failed"

    class Source(models.TextChoices):
        LLM = "llm", "Model"
        MEMORY = "memory", "Memory"

    generation = models.ForeignKey(Generation, on_delete=models.CASCADE, related_name="candidates")
    # Shuffled display order, stored so every reviewer and every reload sees the same order.
    position = models.PositiveSmallIntegerField()
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    source = models.CharField(max_length=10, choices=Source.choices, default=Source.LLM)
    # A memory candidate: the stored example whose preferred answer it offers.
    source_example = models.ForeignKey(
        "memory.Example", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # A captured gateway call: this candidate is exactly the answer the application got.
    served = models.BooleanField(default=False)
    text = models.TextField(blank=True)
    # Triage: the category, priority and reply parsed out of `text`, or why they could not be.
    fields = models.JSONField(null=True, blank=True)
    parse_error = models.TextField(blank=True)
    error = models.TextField(blank=True)
    attempts = models.PositiveSmallIntegerField(default=0)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    model = models.CharField(max_length=200, blank=True)
    latency_ms = models.PositiveIntegerField(null=True, blank=True)
    prompt_tokens = models.PositiveIntegerField(null=True, blank=True)
    completion_tokens = models.PositiveIntegerField(null=True, blank=True)
    cost_usd = models.FloatField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["position"]
        constraints = [
            models.UniqueConstraint(
                fields=["generation", "position"], name="candidate_unique_position"
            ),
        ]

    def __str__(self) -> str:
        return f"Candidate {self.position + 1} of generation {self.generation_id}"

    @property
    def label(self) -> int:
        return self.position + 1
