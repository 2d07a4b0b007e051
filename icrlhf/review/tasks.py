from celery import shared_task

from icrlhf.integrations.webhooks import WebhookTransientError
from icrlhf.review import decisions


# The name predates the webhook's move to review and to every kind of queue: messages
# already queued still find it.
@shared_task(
    name="triage.ticket_webhook",
    autoretry_for=(WebhookTransientError,),
    max_retries=6,
    retry_backoff=5,
    retry_backoff_max=600,
    retry_jitter=True,
)
def decision_webhook(decision_id: int, event: str = "") -> None:
    # No event: a message queued before undo had its own event, a triage.
    decisions.decision_webhook_send(decision_id=decision_id, event=event or "ticket.triaged")
