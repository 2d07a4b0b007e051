from django.conf import settings
from django.db import models

from icrlhf.generation.models import Candidate, Generation
from icrlhf.queues.models import Item


class Decision(models.Model):
    """A reviewer's verdict on one generation. Append-only: never updated in place."""

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
    reason_tags = models.JSONField(default=list, blank=True)
    comment = models.TextField(blank=True)
    guideline_version = models.PositiveIntegerField()
    time_to_decide_ms = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(verdict="none_acceptable", chosen_candidate__isnull=True)
                | (~models.Q(verdict="none_acceptable") & models.Q(chosen_candidate__isnull=False)),
                name="decision_candidate_matches_verdict",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.get_verdict_display()} on item {self.item_id}"
