from typing import ClassVar

from django.db import models

from icrlhf.integrations.database import StampedModel, StampedQuerySet
from icrlhf.queues.models import Queue


class Scope(models.TextChoices):
    """What a token may call. A token has only the scopes it was given."""

    ITEMS = "items", "Items and tickets (send them in, read their decision)"
    GATEWAY = "gateway", "Gateway (OpenAI-compatible chat completions)"
    EXPORT = "export", "Export (every decision of the queue, as training data)"
    FEEDBACK = "feedback", "Feedback (rewards from the application)"


# A new token's scopes unless chosen: never the export, which hands out the whole queue.
DEFAULT_SCOPES = [Scope.ITEMS.value, Scope.GATEWAY.value, Scope.FEEDBACK.value]


def default_scopes() -> list[str]:
    return list(DEFAULT_SCOPES)


class IntegrationToken(StampedModel):
    """An API token for one integration (a helpdesk, a script) into one queue, limited to
    its scopes.

    Only a SHA-256 of the token is stored; the token itself is shown once, when created."""

    rows_stamp: ClassVar[str] = "token-rows"  # processes keep the tokens they authenticated
    objects = StampedQuerySet["IntegrationToken"].as_manager()

    queue = models.ForeignKey(Queue, on_delete=models.CASCADE, related_name="tokens")
    name = models.CharField(max_length=200, help_text="Who uses it, e.g. “Zendesk production”.")
    token_hash = models.CharField(max_length=64, unique=True, editable=False)
    prefix = models.CharField(max_length=12, editable=False, help_text="To recognise it.")
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    scopes = models.JSONField(
        default=default_scopes,
        help_text="What the token may call: items, gateway, export, feedback.",
    )

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…) for {self.queue}"

    def allows(self, scope: str) -> bool:
        return scope in self.scopes
