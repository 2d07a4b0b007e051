from django.db import models

from icrlhf.queues.models import Queue


class ExportRun(models.Model):
    """One export, remembered so that the next one can take only what was decided since."""

    consumer = models.CharField(max_length=200, help_text="user:<name> or token:<id>")
    queue = models.ForeignKey(Queue, null=True, blank=True, on_delete=models.CASCADE)
    format = models.CharField(max_length=20)
    filters = models.JSONField(default=dict)
    records = models.PositiveIntegerField(default=0)
    # The newest decision time the export covered: "since last export" starts after it.
    decided_until = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.format} export by {self.consumer} at {self.created_at}"
