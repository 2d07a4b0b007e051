from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from icrlhf.queues.models import MAX_CANDIDATES, Queue, RoutingChange

# How a queue's gateway calls are routed: what goes to review, what is held out, what memory
# answers alone. Every change to these is audited (RoutingChange).
GATEWAY_FIELDS = (
    "capture_percent",
    "capture_below_similarity",
    "holdout_percent",
    "memory_answer_threshold",
    "memory_answer_confidence",
    "memory_answers_need_approval",
)
AUTOMATION_FIELDS = ("auto_apply_threshold", "audit_percent", "blind_percent")
REWARD_FIELDS = (
    "reward_threshold",
    "rewards_need_approval",
    "capture_low_reward",
    "low_reward_captures_per_run",
)
# Edited on the queue's routing page, each change audited (RoutingChange).
ROUTING_FIELDS = GATEWAY_FIELDS + AUTOMATION_FIELDS + REWARD_FIELDS


def item_input_validate(*, input_text: str) -> str:
    text = input_text.strip()
    if not text:
        raise ValidationError("The input is empty: type the prompt or ticket to answer.")
    if len(text) > settings.ITEM_INPUT_MAX_CHARS:
        raise ValidationError(
            f"The input has {len(text):,} characters; the limit is "
            f"{settings.ITEM_INPUT_MAX_CHARS:,}. Shorten it and try again."
        )
    return text


def candidate_count_validate(*, n_candidates: int) -> int:
    if not 1 <= n_candidates <= MAX_CANDIDATES:
        raise ValidationError(
            f"The number of candidates must be between 1 and {MAX_CANDIDATES}, not {n_candidates}."
        )
    return n_candidates


@transaction.atomic
def queue_save(*, queue: Queue, actor: User | None = None) -> Queue:
    """Save a queue's settings; a change of the routing rules is audited."""
    routing_before: dict[str, Any] = {}
    if queue.pk is not None:
        stored = Queue.objects.select_for_update().filter(pk=queue.pk).first()
        if stored is not None:
            routing_before = {name: getattr(stored, name) for name in ROUTING_FIELDS}
    _low_reward_rule_dated(queue, was_on=bool(routing_before.get("capture_low_reward")))
    queue.save()
    _routing_audit(queue, routing_before, actor)
    return queue


@transaction.atomic
def routing_update(*, queue_id: int, values: dict[str, Any], actor: User) -> Queue:
    """Change a queue's routing rules, and only them (on the row as it is now, so that
    another edit made meanwhile stands); the change is audited."""
    queue = Queue.objects.select_for_update().get(pk=queue_id)
    before = {name: getattr(queue, name) for name in ROUTING_FIELDS}
    for name in ROUTING_FIELDS:
        setattr(queue, name, values[name])
    _low_reward_rule_dated(queue, was_on=before["capture_low_reward"])
    queue.save(update_fields=[*ROUTING_FIELDS, "capture_low_reward_since"])
    _routing_audit(queue, before, actor)
    return queue


def _low_reward_rule_dated(queue: Queue, *, was_on: bool) -> None:
    """The low-reward capture rule captures runs rewarded from the moment it is turned on,
    never those rewarded before (gateway/capture.py)."""
    if queue.capture_low_reward and not was_on:
        queue.capture_low_reward_since = timezone.now()


def _routing_audit(queue: Queue, before: dict[str, Any], actor: User | None) -> None:
    changes = {
        name: [old, getattr(queue, name)]
        for name, old in before.items()
        if old != getattr(queue, name)
    }
    if changes:
        RoutingChange.objects.create(queue=queue, changed_by=actor, changes=changes)
