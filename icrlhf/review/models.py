from django.conf import settings
from django.db import models
from django.db.models import Exists, OuterRef, Q

from icrlhf.generation.models import Candidate, Generation
from icrlhf.queues.models import Item, Queue


def standing_filter(via: str = "") -> Q:
    """Decisions that count: not undone (an undone one stays on record, superseded). On
    Decision rows, or `via` a relation to them ("decisions", "audit_decision") on others."""
    return Q(**{f"{via}__superseded_at__isnull" if via else "superseded_at__isnull": True})


def decided_items(*, queue: Queue, from_memory: bool = False) -> int:
    """Items with a standing decision on a ranked generation: what a confidence is fitted on
    (review.calibrations). `from_memory`: only those whose decided generation offered an
    answer from memory, what the memory-only confidence is fitted on."""
    memory = {"decisions__generation__candidates__source": "memory"} if from_memory else {}
    return (
        queue.items.filter(
            standing_filter("decisions"),
            decisions__generation__ranked_at__isnull=False,
            **memory,
        )
        .distinct()
        .count()
    )


class DecisionQuerySet(models.QuerySet["Decision"]):
    def standing(self) -> "DecisionQuerySet":
        """Decisions that count (`standing_filter`)."""
        return self.filter(standing_filter())

    def first_standing_per_item(self) -> "DecisionQuerySet":
        """Of these decisions, each item's first standing one, oldest first: the earliest, the
        lower id first when two were made at the same instant."""
        decisions = self.standing()
        earlier = decisions.filter(item=OuterRef("item")).filter(
            Q(created_at__lt=OuterRef("created_at"))
            | Q(created_at=OuterRef("created_at"), pk__lt=OuterRef("pk"))
        )
        return decisions.filter(~Exists(earlier)).order_by("created_at", "pk")

    def first_taken(self, taken: bool = True) -> "DecisionQuerySet":
        """Those whose first candidate (the ranking's) was taken as it was, or with `taken`
        False the others: what the playbook's counts and reflection call won and lost. A
        generation never ranked has no first to lose against: its candidate taken won."""
        won = Q(verdict=Decision.Verdict.CHOSEN) & (
            Q(chosen_candidate__rank=1) | Q(chosen_candidate__rank__isnull=True)
        )
        return self.filter(won) if taken else self.exclude(won)


class Decision(models.Model):
    """A reviewer's verdict on one generation. Its verdict and answer are never changed: what
    its kind replaced is filled in as it is made, and an undo marks it superseded, keeping
    it on record."""

    class Verdict(models.TextChoices):
        CHOSEN = "chosen", "Chosen"
        EDITED = "edited", "Edited"
        NONE_ACCEPTABLE = "none_acceptable", "None acceptable"

    item = models.ForeignKey(Item, on_delete=models.CASCADE, related_name="decisions")
    generation = models.ForeignKey(Generation, on_delete=models.CASCADE, related_name="decisions")
    reviewer = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="decisions"
    )
    verdict = models.CharField(max_length=20, choices=Verdict.choices)
    chosen_candidate = models.ForeignKey(
        Candidate,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="The candidate chosen, or the one the final text was edited from.",
    )
    final_text = models.TextField(blank=True)
    final_fields = models.JSONField(
        null=True, blank=True, help_text="Triage: the confirmed category, priority and reply."
    )
    # An agent's step: the tool calls as the reviewer edited them (OpenAI's shape).
    final_tool_calls = models.JSONField(default=list, blank=True)
    replaced = models.JSONField(
        null=True,
        blank=True,
        help_text="What the decision changed beyond itself, as it was before (a triage: the "
        "ticket's category, priority and status), so that an undo restores it.",
    )
    reason_tags = models.JSONField(default=list, blank=True)
    comment = models.TextField(blank=True)
    # The reviewer's optional ratings, {candidate id: 1…5}: each rated candidate's example is
    # stored with its rating as its reward (1 → 0.0 … 5 → 1.0) instead of 1.0 or 0.0.
    ratings = models.JSONField(default=dict, blank=True)
    # How many answers the reviewer had to choose from (done candidates): 1 when the others
    # failed, so that a choice among one is not read as a preference over others.
    candidates_done = models.PositiveSmallIntegerField(null=True, blank=True)
    guideline_version = models.PositiveIntegerField()
    time_to_decide_ms = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # Set by an undo: the decision stays on record, its examples leave the memory.
    superseded_at = models.DateTimeField(null=True, blank=True)

    objects = DecisionQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(verdict="none_acceptable", chosen_candidate__isnull=True)
                | (~models.Q(verdict="none_acceptable") & models.Q(chosen_candidate__isnull=False)),
                name="decision_candidate_matches_verdict",
            ),
            # One standing decision per reviewer and item; undone ones stay on record.
            models.UniqueConstraint(
                fields=["item", "reviewer"],
                condition=standing_filter(),
                name="decision_one_standing_per_reviewer",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.get_verdict_display()} on item {self.item_id}"


class Claim(models.Model):
    """A reviewer's hold on an item, with an expiry: a lock with a TTL.

    One row per reviewer and item. It is active while `expires_at` is in the future; releasing
    it sets `expires_at` to now. A skip releases it and puts the item after every other one in
    that reviewer's "next item" (until they take it again)."""

    item = models.ForeignKey(Item, on_delete=models.CASCADE, related_name="claims")
    reviewer = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="claims"
    )
    expires_at = models.DateTimeField()
    skipped = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["item", "reviewer"], name="claim_one_per_reviewer"),
        ]
        indexes = [models.Index(fields=["item", "expires_at"])]

    def __str__(self) -> str:
        return f"Claim of item {self.item_id} by {self.reviewer_id} until {self.expires_at}"


# Automations that count: not undone (an undone one stays on record). The one definition, for
# queries (`Automation.objects.standing()`), the constraint and a row already read (`.standing`).
AUTOMATION_STANDING = Q(undone_at__isnull=True)


class AutomationQuerySet(models.QuerySet["Automation"]):
    def standing(self) -> "AutomationQuerySet":
        return self.filter(AUTOMATION_STANDING)


class Automation(models.Model):
    """An item whose first candidate was applied without review, its calibrated confidence
    being above the queue's threshold. Kept apart from reviewers' decisions: it is not a
    preference, so it teaches the memory nothing and is not exported. An audited one stays in
    review; the reviewer's decision there says whether the automation was right."""

    item = models.ForeignKey(Item, on_delete=models.CASCADE, related_name="automations")
    generation = models.ForeignKey(Generation, on_delete=models.CASCADE, related_name="+")
    candidate = models.ForeignKey(Candidate, on_delete=models.PROTECT, related_name="+")
    confidence = models.FloatField()
    threshold = models.FloatField(help_text="The queue's threshold when it was applied.")
    audit = models.BooleanField(help_text="Sampled to go to review all the same.")
    final_text = models.TextField()
    final_fields = models.JSONField(null=True, blank=True)
    replaced = models.JSONField(
        null=True, blank=True, help_text="What applying it changed (a ticket's fields), for undo."
    )
    audit_decision = models.ForeignKey(
        Decision, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    undone_at = models.DateTimeField(null=True, blank=True)
    undone_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    objects = AutomationQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            # One standing automation per item; undone ones stay on record.
            models.UniqueConstraint(
                fields=["item"],
                condition=AUTOMATION_STANDING,
                name="automation_one_standing_per_item",
            ),
        ]

    def __str__(self) -> str:
        return f"Automation of item {self.item_id} at {self.confidence:.0%}"

    @property
    def standing(self) -> bool:
        """Not undone (`AutomationQuerySet.standing`, for one row already read)."""
        return self.undone_at is None


class AutomationPause(models.Model):
    """Automation paused for a queue by the test on its audits (review/guard.py): what the
    audits showed, and the curator who resumed it."""

    queue = models.ForeignKey(Queue, on_delete=models.CASCADE, related_name="automation_pauses")
    paused_at = models.DateTimeField(auto_now_add=True)
    target = models.FloatField(help_text="The precision promised: the threshold then.")
    audits = models.PositiveIntegerField()
    agreed = models.PositiveIntegerField(help_text="Audits that kept what was applied.")
    log_ratio = models.FloatField()
    upper_bound = models.FloatField(help_text="The audited precision's 95% upper bound.")
    resumed_at = models.DateTimeField(null=True, blank=True)
    resumed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["-paused_at"]
        constraints = [
            # At most one pause stands per queue.
            models.UniqueConstraint(
                fields=["queue"],
                condition=models.Q(resumed_at__isnull=True),
                name="automation_pause_one_standing_per_queue",
            ),
        ]

    def __str__(self) -> str:
        return f"Automation of {self.queue} paused at {self.paused_at:%Y-%m-%d %H:%M}"
