"""A queue's playbook: the rules its answers follow, as entries in sections, versioned.

An entry's text never changes: an edit is a new entry with the same key (`revises` the one it
replaced), so a version, the set of entries it holds, says exactly what a prompt carried, and
each entry's counts are those of its own words."""

from django.conf import settings
from django.db import models

from icrlhf.queues.models import Queue

ENTRY_MAX_CHARS = 500
SECTION_MAX_CHARS = 80
# The most entries one version holds: each is in every prompt of the queue.
ENTRIES_MAX = 40


class Entry(models.Model):
    queue = models.ForeignKey(Queue, on_delete=models.CASCADE, related_name="playbook_entries")
    # The entry's name across its edits ("E3"): what a reviewer, a curator and a reflection
    # cite.
    key = models.PositiveIntegerField()
    section = models.CharField(max_length=SECTION_MAX_CHARS)
    text = models.TextField()
    revises = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # The decisions and agents' runs that motivated it (ids; runs' as text; both empty for
    # an entry a person wrote from nothing).
    sources = models.JSONField(default=list, blank=True)
    run_sources = models.JSONField(default=list, blank=True)
    # Reviewed generations whose prompt held this entry: the first candidate taken as it
    # was, or not (another one, an edit, none acceptable).
    first_chosen = models.PositiveIntegerField(default=0)
    first_not_chosen = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name_plural = "entries"
        ordering = ["section", "key", "pk"]
        indexes = [models.Index(fields=["queue", "key"])]

    def __str__(self) -> str:
        return f"{self.name} of {self.queue}: {self.text[:60]}"

    @property
    def name(self) -> str:
        return f"E{self.key}"


class Version(models.Model):
    """The playbook as prompts carry it from `created_at` until the next version."""

    class Origin(models.TextChoices):
        WRITTEN = "written", "written by a person"
        REFLECTION = "reflection", "proposed by reflection, approved by a person"
        ROLLBACK = "rollback", "an earlier version restored"
        IMPORTED = "imported", "imported from a file"
        GUIDELINES = "guidelines", "the queue's guidelines before playbooks"

    queue = models.ForeignKey(Queue, on_delete=models.CASCADE, related_name="playbook_versions")
    number = models.PositiveIntegerField()
    entries = models.ManyToManyField(Entry, related_name="versions", blank=True)
    origin = models.CharField(max_length=12, choices=Origin.choices)
    # Who wrote it, or approved it.
    author = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    summary = models.CharField(max_length=300, blank=True)
    # The entries as prompts carry them, written once with the version (its entries never
    # change): a prompt reads the playbook in one row.
    prompt_text = models.TextField(blank=True)
    restored_from = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-number"]
        get_latest_by = "number"
        constraints = [
            models.UniqueConstraint(fields=["queue", "number"], name="playbook_version_unique")
        ]

    def __str__(self) -> str:
        return f"Playbook version {self.number} of {self.queue}"
