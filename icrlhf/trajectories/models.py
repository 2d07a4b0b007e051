"""An agent's run: its goal, then steps of state → action → observation, and how it ended.

The gateway groups calls into trajectories (services.step_record); the rows point at the
gateway's calls by name ("gateway.Call"), so this app never imports the gateway."""

import uuid

from django.conf import settings
from django.db import models
from django.utils import timezone

from icrlhf.queues.models import Queue


class Trajectory(models.Model):
    class Outcome(models.TextChoices):
        OPEN = "", "not known yet"
        SUCCEEDED = "succeeded", "succeeded"
        FAILED = "failed", "failed"

    class Approval(models.TextChoices):
        NOT_NEEDED = "", "not needed"
        PENDING = "pending", "awaiting a reviewer's approval"
        APPROVED = "approved", "approved into memory"
        DECLINED = "declined", "declined: kept out of memory"

    class Grouping(models.TextChoices):
        KEY = "key", "the caller's trajectory id"
        CONTINUATION = "continuation", "its calls extend each other's messages"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    queue = models.ForeignKey(Queue, on_delete=models.CASCADE, related_name="trajectories")
    # Its owner: the token whose calls made it, and the end user those calls named in `user`
    # ("" when they named none), as a keyed hash (services.end_user_key): the id itself is
    # not kept. Only its owner's calls continue it, and only its owner's feedback rewards it
    # (a reviewer, in the web app, sees every run of the queue).
    token = models.ForeignKey(
        "ingest.IntegrationToken", null=True, blank=True, on_delete=models.SET_NULL
    )
    end_user = models.CharField(max_length=500, blank=True)
    # The id the caller sent (X-Icrlhf-Trajectory or metadata.trajectory_id); "" when the
    # calls were grouped by their messages.
    key = models.CharField(max_length=200, blank=True)
    grouping = models.CharField(max_length=12, choices=Grouping.choices)
    goal = models.TextField(help_text="The first user message.")
    tool_names = models.JSONField(default=list, blank=True, help_text="The tools offered.")
    created_at = models.DateTimeField(default=timezone.now)
    last_step_at = models.DateTimeField(default=timezone.now)
    step_count = models.PositiveIntegerField(default=0)
    outcome = models.CharField(max_length=10, choices=Outcome.choices, blank=True, default="")
    reward = models.FloatField(null=True, blank=True)
    # Under the queue's "rewarded runs need a reviewer's approval": where the run stands.
    approval = models.CharField(max_length=10, choices=Approval.choices, blank=True, default="")
    approved_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    approved_at = models.DateTimeField(null=True, blank=True)
    # How many of its steps were ever chosen for review for a low reward, whatever became of
    # the capture (deleted, a duplicate): the queue's cap per run counts them all.
    low_reward_captures = models.PositiveIntegerField(default=0)
    # The examples its calls were prompted with have been credited with its reward (once).
    usage_credited = models.BooleanField(default=False)
    # When retention blanked what end users wrote in it (CALL_RETENTION_DAYS).
    purged_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-last_step_at", "-pk"]
        constraints = [
            # A key names a run among its owner's: two tokens (or two end users of one) that
            # pick the same key get two runs.
            models.UniqueConstraint(
                fields=["queue", "token", "end_user", "key"],
                condition=~models.Q(key=""),
                name="trajectory_key_unique_per_owner",
            )
        ]
        indexes = [models.Index(fields=["queue", "last_step_at"])]

    def __str__(self) -> str:
        return f"trajectory {self.pk} in {self.queue}"


class Step(models.Model):
    """One decision: what the agent saw since its last step (the observation: tool results,
    or the user's next words), the decision point memory searched with, and what it did."""

    trajectory = models.ForeignKey(Trajectory, on_delete=models.CASCADE, related_name="steps")
    position = models.PositiveIntegerField()
    # The call that made the decision (gone once the call log's retention removed it).
    call = models.OneToOneField(
        "gateway.Call", null=True, blank=True, on_delete=models.SET_NULL, related_name="step"
    )
    created_at = models.DateTimeField(default=timezone.now)
    observation = models.JSONField(default=list, blank=True)
    decision_point = models.TextField()
    action_text = models.TextField(blank=True)
    tool_calls = models.JSONField(default=list, blank=True)
    # SHA-256 of the conversation as the agent's next call sends it (this call's messages and
    # its answer): how a later call without a trajectory id is recognised as the next step.
    continuation_hash = models.CharField(max_length=64, db_index=True)
    # The latest reward the application gave this step's call (feedback on the call).
    reward = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ["trajectory", "position", "pk"]
        indexes = [models.Index(fields=["trajectory", "position"])]

    def __str__(self) -> str:
        return f"step {self.position} of {self.trajectory_id}"


class Feedback(models.Model):
    """What the application says about a call or a whole run: a reward, success, a comment,
    and optionally the action that would have been right. Posted once per key (idempotent)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    queue = models.ForeignKey(Queue, on_delete=models.CASCADE, related_name="feedback")
    trajectory = models.ForeignKey(Trajectory, on_delete=models.CASCADE, related_name="feedback")
    # On one step (the call it was posted on); none: on the whole trajectory.
    step = models.ForeignKey(
        Step, null=True, blank=True, on_delete=models.CASCADE, related_name="feedback"
    )
    # The caller's key for this feedback (Idempotency-Key, or the body's feedback_id), one
    # namespace per token: the same key with the same body returns the first one and changes
    # nothing; with another body it is refused (feedback.FeedbackKeyConflict).
    key = models.CharField(max_length=200)
    reward = models.FloatField(null=True, blank=True)
    success = models.BooleanField(null=True, blank=True)
    comment = models.TextField(blank=True)
    # {"content": "..."} or {"tool_calls": [...]}, in OpenAI's shape.
    corrected_action = models.JSONField(default=dict, blank=True)
    token = models.ForeignKey(
        "ingest.IntegrationToken", null=True, blank=True, on_delete=models.SET_NULL
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at", "-pk"]
        constraints = [
            models.UniqueConstraint(
                fields=["queue", "token", "key"], name="feedback_key_unique_per_token"
            )
        ]

    def __str__(self) -> str:
        return f"feedback {self.pk} on {self.trajectory_id}"
