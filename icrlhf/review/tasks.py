from typing import Any

from celery import shared_task

from icrlhf.integrations.webhooks import WebhookTransientError
from icrlhf.review import calibrations, guard, webhooks

# The name predates the webhook's move to review and to every kind of queue: messages
# already queued still find it.
# A receiver may be down for a while: retry for about an hour, with backoff.
_WEBHOOK_RETRIES: dict[str, Any] = {
    "autoretry_for": (WebhookTransientError,),
    "max_retries": 6,
    "retry_backoff": 5,
    "retry_backoff_max": 600,
    "retry_jitter": True,
}


@shared_task(name="triage.ticket_webhook", **_WEBHOOK_RETRIES)
def decision_webhook(decision_id: int, event: str = "") -> None:
    # No event: a message queued before undo had its own event, a triage.
    webhooks.decision_webhook_send(decision_id=decision_id, event=event or "ticket.triaged")


@shared_task(name="review.automation_webhook", **_WEBHOOK_RETRIES)
def automation_webhook(automation_id: int, event: str) -> None:
    webhooks.automation_webhook_send(automation_id=automation_id, event=event)


@shared_task(name="review.pause_webhook", **_WEBHOOK_RETRIES)
def pause_webhook(pause_id: int) -> None:
    guard.pause_webhook_send(pause_id=pause_id)


@shared_task(name="review.calibrations_refit")
def calibrations_refit() -> None:
    """Periodic: refit the calibration of queues with enough new decisions."""
    calibrations.calibrations_refit()
