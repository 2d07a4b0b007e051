"""Reflection's proposals: mutations of a queue's playbook that a model drew from a batch of
decisions the queue's first candidate lost and of agents' runs with weak steps, each citing
the decisions and runs behind it, waiting for a curator. What was decided of earlier
proposals is the reflector's memory (the optimizer state), so that it does not propose again
what a curator rejected."""

from django.conf import settings
from django.db import models

from icrlhf.playbook.models import ENTRY_MAX_CHARS, SECTION_MAX_CHARS, Version
from icrlhf.queues.models import Queue


class Proposal(models.Model):
    class Status(models.TextChoices):
        RUNNING = "running", "reflecting"
        OPEN = "open", "waiting for a curator"
        DECIDED = "decided", "decided"
        EMPTY = "empty", "nothing proposed"
        FAILED = "failed", "reflection failed"

    queue = models.ForeignKey(Queue, on_delete=models.CASCADE, related_name="proposals")
    # The playbook the reflector read (none: the queue had none yet).
    based_on = models.ForeignKey(
        Version, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    model = models.CharField(max_length=200)
    # The decisions it read (ids, newest first) and the agents' runs (ids, as text): the
    # batch's dual traces, numbered in that order in the reflector's prompt.
    decisions = models.JSONField(default=list)
    runs = models.JSONField(default=list, blank=True)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.RUNNING)
    # Why it failed, or what of the reflector's answer was refused (and why).
    notes = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    decided_at = models.DateTimeField(null=True, blank=True)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    # The replay of the draft (the playbook with every proposed change) on the batch's
    # failures and a sample of successes: how many of each now get the reviewer's answer,
    # and how that was scored (none: not replayed).
    replay_fixed = models.PositiveSmallIntegerField(null=True, blank=True)
    replay_failures = models.PositiveSmallIntegerField(null=True, blank=True)
    replay_broke = models.PositiveSmallIntegerField(null=True, blank=True)
    replay_successes = models.PositiveSmallIntegerField(null=True, blank=True)
    replay_scored_by = models.CharField(max_length=40, blank=True)
    # The playbook version its approved mutations made (none: all rejected).
    made = models.ForeignKey(
        Version, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["-created_at", "-pk"]

    def __str__(self) -> str:
        return f"Proposal {self.pk} for {self.queue}"


class Mutation(models.Model):
    class Op(models.TextChoices):
        ADD = "add", "add a rule"
        EDIT = "edit", "reword a rule"
        RETIRE = "retire", "retire a rule"

    class Status(models.TextChoices):
        PENDING = "pending", "waiting"
        APPROVED = "approved", "approved"
        REJECTED = "rejected", "rejected"

    proposal = models.ForeignKey(Proposal, on_delete=models.CASCADE, related_name="mutations")
    op = models.CharField(max_length=6, choices=Op.choices)
    # The entry it edits or retires (its key); none for an addition.
    key = models.PositiveIntegerField(null=True, blank=True)
    section = models.CharField(max_length=SECTION_MAX_CHARS, blank=True)
    text = models.TextField(max_length=ENTRY_MAX_CHARS, blank=True)
    # The decisions of the batch it rests on (ids), and its runs (ids, as text).
    cites = models.JSONField(default=list)
    cites_runs = models.JSONField(default=list, blank=True)
    # The reflector's reason, as it gave it (untrusted: shown escaped, never in a prompt).
    why = models.TextField(blank=True)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)

    class Meta:
        ordering = ["pk"]

    def __str__(self) -> str:
        return f"{self.get_op_display()} ({self.status})"
