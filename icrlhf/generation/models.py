from django.db import models

from icrlhf.queues.models import Item, Queue


class Calibration(models.Model):
    """A queue's model of how likely reviewers are to accept a candidate as it is, fitted on
    its decided items (see `ranking.py`); the newest one ranks new generations."""

    queue = models.ForeignKey(Queue, on_delete=models.CASCADE, related_name="calibrations")
    features = models.JSONField(help_text="The features' names, in the coefficients' order.")
    coefficients = models.JSONField(
        help_text="The ranking's score: a logistic regression over candidates, intercept first."
    )
    top_coefficients = models.JSONField(
        help_text="The confidence: a logistic fit of the top candidate's score, intercept first."
    )
    items = models.PositiveIntegerField(help_text="Decided items it was fitted on.")
    candidates = models.PositiveIntegerField()
    accepted_share = models.FloatField(help_text="Share of those items whose top was accepted.")
    ece = models.FloatField(
        null=True, help_text="Expected calibration error of the top candidate, forward."
    )
    # Forward (fitted on earlier decisions, measured on later ones), for each threshold: the
    # precision with its lower confidence bound, and the share of items it would automate.
    curve = models.JSONField(default=list)
    # For each target precision: the lowest threshold whose lower bound reaches it, or why
    # none can be promised yet (calibration.Recommendation).
    recommendations = models.JSONField(default=list)
    isotonic = models.JSONField(
        null=True,
        blank=True,
        help_text="The confidence as an isotonic map ([score, probability] knots), when it "
        "measured better forward than the logistic fit in top_coefficients.",
    )
    # Answering from memory alone (the gateway): the memory-only ranking, its confidence
    # (platt, isotonic), and its forward ece, curve and recommendations, as above; empty
    # while too few decided items had a memory candidate.
    memory_fit = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        get_latest_by = "created_at"

    def __str__(self) -> str:
        return f"Calibration of {self.queue} on {self.items} items"


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
    # For the ranking: the nearest stored preferred examples ({score, vote_key}), then the
    # nearest rejected ones ({score, vote_key, rejected: true}; before votes were keyed by
    # the kind, {score, answer_key}), and how many preferred examples the queue had.
    neighbours = models.JSONField(default=list, blank=True)
    stored_examples = models.PositiveIntegerField(default=0)
    # The queue's minimum similarity when this generation retrieved (empty: it did not), and
    # the examples it kept out of the prompt ({example, score}, best first): the reviewer sees
    # them, nothing else uses them.
    min_similarity = models.FloatField(null=True, blank=True)
    below_minimum = models.JSONField(default=list, blank=True)
    ranked_at = models.DateTimeField(null=True, blank=True)
    # Shown blind: its candidates keep their shuffled order and no confidence is shown, so
    # that what the order does to reviewers can be measured (the queue's blind share).
    blind = models.BooleanField(default=False)
    # A reviewer's "try again" on this round: {"rewards": {candidate id: reward}, "reasons":
    # [...], "comment": "...", "reviewer": name}. The next round is prompted with this one's
    # answers and rewards as earlier attempts (selectors.attempts_earlier).
    try_again = models.JSONField(null=True, blank=True)
    calibration = models.ForeignKey(
        Calibration, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # The queue's playbook as its prompt carried it (none: the queue had none).
    playbook = models.ForeignKey(
        "playbook.Version", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
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
    # Display order, stored so every reviewer and every reload sees the same order: shuffled,
    # then best first once the generation is ranked.
    position = models.PositiveSmallIntegerField()
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    source = models.CharField(max_length=10, choices=Source.choices, default=Source.LLM)
    # A memory candidate: the stored example whose preferred answer it offers.
    source_example = models.ForeignKey(
        "memory.Example", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # A captured gateway call: this candidate is exactly the answer the application got.
    served = models.BooleanField(default=False)
    # The reward this answer had before review: the application's, for an answer it was served
    # in a run it rewarded below the bar (a low-reward capture). The other candidates are
    # written with it in view, as an earlier attempt.
    reward = models.FloatField(null=True, blank=True)
    text = models.TextField(blank=True)
    # The action's tool calls, in OpenAI's shape (a captured or generated agent step).
    tool_calls = models.JSONField(default=list, blank=True)
    # Triage: the category, priority and reply parsed out of `text`, or why they could not be.
    fields = models.JSONField(null=True, blank=True)
    parse_error = models.TextField(blank=True)
    # Set by the ranking: what it knew of this answer, and the calibrated probability that a
    # reviewer accepts it as it is (empty until the queue has a calibration).
    ranking_features = models.JSONField(null=True, blank=True)
    confidence = models.FloatField(null=True, blank=True)
    # Its place in the ranking (1: the ranking's first), whatever place it is shown in.
    rank = models.PositiveSmallIntegerField(null=True, blank=True)
    error = models.TextField(blank=True)
    attempts = models.PositiveSmallIntegerField(default=0)
    # When a transient failure's retry is due: the item page counts down to it.
    retry_at = models.DateTimeField(null=True, blank=True)
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
