"""Automation: above the queue's confidence threshold, an item's first candidate is applied
without review (a triage written back to its ticket, the decision webhook sent), a sampled
share goes to review all the same as an audit, and any of them can be undone. The audits
watch it: a broken promise pauses it (guard.py)."""

import logging
import random
from collections.abc import Callable
from typing import Any

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from icrlhf.generation import selectors as generation_selectors
from icrlhf.generation.models import Candidate, Generation
from icrlhf.kinds import kind_of
from icrlhf.queues.locks import item_lock
from icrlhf.queues.models import Item, Queue
from icrlhf.review import guard, tasks
from icrlhf.review.claims import DecisionConflict
from icrlhf.review.models import Automation, Decision

logger = logging.getLogger(__name__)


def generation_consider(*, generation_id: int) -> Automation | None:
    """Apply the ranked generation's first candidate if the queue automates and it is
    confident enough; None when it stays with the reviewers."""
    generation = Generation.objects.select_related("item__queue").get(pk=generation_id)
    queue = generation.item.queue
    if queue.auto_apply_threshold is None or generation.calibration_id is None:
        return None
    if guard.pause_active(queue) is not None:
        return None  # its audits broke the promise: the reviewers have it until resumed
    # The ranking gives its top candidate, and only it, a confidence.
    first = (
        generation.candidates.filter(status=Candidate.Status.DONE, confidence__isnull=False)
        .order_by("position")
        .first()
    )
    if first is None or first.confidence is None or first.confidence < queue.auto_apply_threshold:
        return None
    kind = kind_of(queue)
    try:
        final = kind.final(picked_fields=first.fields, corrections={}, queue=queue)
    except ValidationError:
        return None  # a triage missing a field is never applied unseen
    with transaction.atomic():
        item = item_lock(generation.item_id)
        latest = generation_selectors.generation_latest(item=item)
        if (
            item.status != Item.Status.READY
            or latest is None
            or latest.pk != generation.pk
            or item.decisions.standing().exists()
            # Once undone, an item is the reviewers' (a regenerated one too).
            or item.automations.exists()
            or item.claims.filter(expires_at__gt=timezone.now()).exists()  # a reviewer has it
        ):
            return None
        audit = random.random() * 100 < queue.audit_percent
        automation = Automation.objects.create(
            item=item,
            generation=generation,
            candidate=first,
            confidence=first.confidence,
            threshold=queue.auto_apply_threshold,
            audit=audit,
            final_text=final.text if final else first.text,
            final_fields=final.fields if final else None,
            replaced=kind.on_decision(item_id=item.pk, final=final) if final else None,
        )
        Item.objects.filter(pk=item.pk).update(
            status=Item.Status.READY if audit else Item.Status.AUTOMATED,
            updated_at=timezone.now(),
        )
        _webhook_on_commit(automation, kind.decided_event)
    return automation


@transaction.atomic
def automation_undo(*, automation_id: int, actor: User) -> Automation:
    """Take an automatic application back: what it changed is put back, the receiver is told,
    and the item goes to the reviewers. The item is locked first, as a decision locks it
    (the other order could deadlock with an audit's decision)."""
    item_id = Automation.objects.values_list("item_id", flat=True).get(pk=automation_id)
    item = item_lock(item_id)
    automation = Automation.objects.select_for_update().get(pk=automation_id)
    if not automation.standing:
        raise DecisionConflict("This automatic application has already been undone.")
    if automation.audit_decision_id is not None:
        raise DecisionConflict(
            "A reviewer has decided this item since; undo their decision instead."
        )
    if automation.audit:
        # Its audit decides it: an undo would drop the audit from the measured precision.
        raise DecisionConflict(
            "This item is sampled for audit: the reviewer's decision confirms or replaces it."
        )
    automation.undone_at, automation.undone_by = timezone.now(), actor
    automation.save(update_fields=["undone_at", "undone_by"])
    kind = kind_of(item.queue)
    if automation.replaced is not None:
        kind.on_undo(item_id=item.pk, replaced=automation.replaced)
    Item.objects.filter(pk=item.pk, status=Item.Status.AUTOMATED).update(
        status=Item.Status.READY, updated_at=timezone.now()
    )
    _webhook_on_commit(automation, kind.undone_event)
    return automation


def audit_record(*, decision: Decision) -> None:
    """A reviewer decided an item that was applied automatically (an audit): the decision
    now stands for it, and tells whether the automation was right."""
    audited = (
        Automation.objects.standing()
        .filter(item_id=decision.item_id, audit_decision__isnull=True)
        .update(audit_decision=decision)
    )
    if not audited:
        return
    try:
        with transaction.atomic():  # a savepoint: the reviewer's decision stands whatever
            pause = guard.automation_check(queue_id=decision.item.queue_id)
    except Exception:  # noqa: BLE001 (the decision is what matters; the next audit checks again)
        logger.exception("Checking the audits of queue %s failed", decision.item.queue_id)
        return
    if pause is not None and decision.item.queue.webhook_url:
        transaction.on_commit(lambda: tasks.pause_webhook.delay(pause.pk), robust=True)


def audit_withdraw(*, decision: Decision) -> None:
    """The audit's decision was undone: the item waits for its audit again."""
    Automation.objects.filter(audit_decision=decision).update(audit_decision=None)


def _webhook_on_commit(automation: Automation, event: str) -> None:
    webhook_on_commit(
        queue=automation.item.queue,
        final_fields=automation.final_fields,
        send=lambda: tasks.automation_webhook.delay(automation.pk, event),
    )


def webhook_on_commit(*, queue: Queue, final_fields: Any, send: Callable[[], object]) -> None:
    """Send the decision webhook once the transaction commits, if the queue has a receiver
    and its kind tells it about this outcome."""
    if queue.webhook_url and kind_of(queue).webhook_wanted(final_fields=final_fields):
        transaction.on_commit(send, robust=True)
