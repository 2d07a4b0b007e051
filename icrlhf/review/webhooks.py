"""The decision webhook's messages, built from what is stored when the worker sends them: a
decision made or undone, and an automatic application. tasks.py sends them; decisions and
automation enqueue those tasks, so this module imports neither (no cycle through tasks)."""

from datetime import datetime
from typing import Any

from icrlhf.integrations import webhooks
from icrlhf.kinds import kind_of
from icrlhf.queues.models import Item
from icrlhf.review.models import Automation, Decision


def decision_webhook_send(*, decision_id: int, event: str) -> None:
    """Tell the queue's receiver, signed: a decision made (unless undone since: its undo
    follows), or taken back (with the item as it is now, restored)."""
    decision = Decision.objects.select_related("item__queue", "reviewer", "chosen_candidate").get(
        pk=decision_id
    )
    if event == kind_of(decision.item.queue).decided_event and decision.superseded_at:
        return
    chosen = decision.chosen_candidate
    _webhook_post(
        decision.item,
        event=event,
        verdict=decision.verdict,
        final_text=decision.final_text,
        final_fields=decision.final_fields,
        # A captured gateway call: whether reviewers kept what the application was served.
        served_accepted=(
            decision.verdict == Decision.Verdict.CHOSEN and chosen is not None and chosen.served
        ),
        decision_id=decision.pk,
        decided_by=decision.reviewer.get_username(),
        decided_at=decision.created_at,
        undone_at=decision.superseded_at,
    )


def automation_webhook_send(*, automation_id: int, event: str) -> None:
    """The same message for an automatic application (`automated: true`, its confidence)."""
    applied = Automation.objects.select_related("item__queue", "candidate").get(pk=automation_id)
    if event == kind_of(applied.item.queue).decided_event and (
        not applied.standing or applied.audit_decision_id
    ):
        return  # undone (its undo follows), or an audit decided since (its decision was sent)
    _webhook_post(
        applied.item,
        event=event,
        verdict=Decision.Verdict.CHOSEN,
        final_text=applied.final_text,
        final_fields=applied.final_fields,
        served_accepted=applied.candidate.served,
        decision_id=None,
        decided_by=None,
        decided_at=applied.created_at,
        undone_at=applied.undone_at,
        automated=True,
        confidence=applied.confidence,
    )


def _webhook_post(
    item: Item,
    *,
    event: str,
    final_fields: dict[str, Any] | None,
    decided_at: datetime,
    undone_at: datetime | None,
    **fields: Any,
) -> None:
    queue = item.queue
    if not queue.webhook_url:
        return
    payload = {
        "event": event,
        "queue": queue.slug,
        "item": {
            "id": item.pk,
            "external_id": item.external_id,
            "source": item.source,
            "input": item.input_text,
            "metadata": item.metadata,
            "status": item.status,
        },
        "automated": False,
        "final_fields": final_fields,
        **fields,
        "decided_at": decided_at.isoformat(),
        "undone_at": undone_at.isoformat() if undone_at else None,
        **kind_of(queue).webhook_extra(item=item, final_fields=final_fields),
    }
    webhooks.post_signed(
        url=queue.webhook_url, secret=queue.webhook_secret, event=event, payload=payload
    )
