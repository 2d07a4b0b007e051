from django.db import models

from icrlhf.queues.models import Queue


class IntegrationToken(models.Model):
    """An API token for one integration (a helpdesk, a script) into one queue.

    Only a SHA-256 of the token is stored; the token itself is shown once, when created."""

    queue = models.ForeignKey(Queue, on_delete=models.CASCADE, related_name="tokens")
    name = models.CharField(max_length=200, help_text="Who uses it, e.g. “Zendesk production”.")
    token_hash = models.CharField(max_length=64, unique=True, editable=False)
    prefix = models.CharField(max_length=12, editable=False, help_text="To recognise it.")
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…) for {self.queue}"
