from celery import shared_task

from icrlhf.integrations.webhooks import WebhookTransientError
from icrlhf.review import decisions


# The name predates the task's move to review: messages already queued still find it.
@shared_task(
    name="triage.ticket_webhook",
    autoretry_for=(WebhookTransientError,),
    max_retries=6,
    retry_backoff=5,
    retry_backoff_max=600,
    retry_jitter=True,
)
def ticket_webhook(decision_id: int, event: str = "") -> None:
    # No event: a message queued before undo had its own event, a triage.
    decisions.ticket_webhook_send(decision_id=decision_id, event=event or decisions.TRIAGED)
