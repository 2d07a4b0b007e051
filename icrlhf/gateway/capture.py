"""Production traffic back to review: a gateway call chosen for review (sampled, not
covered by memory, or a step of an agent run rewarded below the bar) becomes an item whose
first candidate is exactly what the application got; the worker generates the others, and
the decision becomes memory as any other.

Captured after the call's log row is written, never on the way to the answer; a capture
that fails (the database busy, the process stopped) is retried by the sweeper."""

import logging
import uuid
from collections import Counter
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Exists, F, OuterRef, Q
from django.utils import timezone

from icrlhf.gateway.models import Call
from icrlhf.generation.services import Served, item_create
from icrlhf.ingest.services import CreationLimitReached, token_creation_check
from icrlhf.integrations.redaction import scrub
from icrlhf.queues.models import Item, Queue
from icrlhf.trajectories.models import Feedback, Step, Trajectory
from icrlhf.trajectories.selectors import APPROVAL_ALLOWS_MEMORY, low_reward_q

logger = logging.getLogger(__name__)

CAPTURING = (Call.Capture.SAMPLED, Call.Capture.UNCOVERED, Call.Capture.LOW_REWARD)
# A capture still missing this long after its call was lost on the way (the sweeper's cue);
# younger ones are most likely being written right now.
_LOST_AFTER = timedelta(seconds=60)
# Older calls are not captured any more: their moment has passed.
_GIVE_UP_AFTER = timedelta(days=1)


def call_capture(*, call_id: uuid.UUID) -> Item | None:
    """Make the call a review item, unless it is not chosen, done already, or an identical
    request was captured within CAPTURE_DEDUPE_WINDOW_S (then it is marked a duplicate)."""
    with transaction.atomic():
        call = Call.objects.select_for_update().filter(pk=call_id).first()
        if call is None or call.item_id is not None or call.capture not in CAPTURING:
            return None
        # One capture at a time per queue, so two identical calls are not both captured. "No
        # key": new calls of the queue (rows pointing at it) are not held up by this lock.
        queue = Queue.objects.select_for_update(no_key=True).get(pk=call.queue_id)
        window = timedelta(seconds=settings.CAPTURE_DEDUPE_WINDOW_S)
        earlier = Call.objects.filter(
            queue=queue,
            request_hash=call.request_hash,
            item__isnull=False,
            created_at__gte=call.created_at - window,
        ).exclude(pk=call.pk)
        if earlier.exists():
            call.capture = Call.Capture.DUPLICATE
            call.save(update_fields=["capture"])
            return None
        if call.capture == Call.Capture.LOW_REWARD and call.token_id is not None:
            # Chosen after the call, by the application's reward: the token's own review
            # work, within its item limit (refused: the sweep tries again in a minute).
            try:
                token_creation_check(token_id=call.token_id, count=1, noun="items")
            except CreationLimitReached:
                return None
        # The call was logged before review chose it (a low reward): what review keeps is
        # redacted now, in the log row too (REDACTION: captured or all).
        _redact_for_review(call)
        example_id = call.examples[0]["id"] if call.source == Call.Source.MEMORY else None
        conversation = call.context
        if not conversation or conversation[-1].get("role") not in ("user", "tool"):
            # Logged before a call's last message was kept with the others.
            conversation = [*conversation, {"role": "user", "content": call.request_text}]
        served = Served(
            reward=_reward_given(call) if call.capture == Call.Capture.LOW_REWARD else None,
            text=call.answer_text if not call.tool_calls else "",
            tool_calls=call.tool_calls,
            model=call.model,
            example_id=uuid.UUID(example_id) if example_id else None,
            latency_ms=call.upstream_ms,
            prompt_tokens=call.prompt_tokens or None,
            completion_tokens=call.completion_tokens or None,
        )
        try:
            with transaction.atomic():
                item = item_create(
                    queue=queue,
                    input_text=call.request_text,
                    created_by=None,
                    source=Item.Source.GATEWAY,
                    served=served,
                    metadata={"call": str(call.pk), "holdout": call.holdout},
                    # The N−1 other candidates answer the same conversation, with the same
                    # tools and output format, as the one served.
                    conversation=conversation,
                    # Review needs the tools and the output format, not who asked.
                    call_options=_without_end_user(call.options),
                )
        except ValidationError as error:  # e.g. a request longer than items may be
            call.capture = Call.Capture.NONE
            call.error = f"Not captured: {' '.join(error.messages)}"[:500]
            call.save(update_fields=["capture", "error"])
            return None
        call.item = item
        call.save(update_fields=["item"])
        return item


def _redact_for_review(call: Call) -> None:
    """The call and the agent step it made, as a call captured when it was made keeps them."""
    fields = ("request_text", "context", "answer_text", "tool_calls", "options")
    for name in fields:
        setattr(call, name, scrub(getattr(call, name), into="review"))
    call.save(update_fields=fields)
    for step in Step.objects.filter(call=call):
        step_fields = ("observation", "decision_point", "action_text", "tool_calls")
        for name in step_fields:
            setattr(step, name, scrub(getattr(step, name), into="review"))
        step.save(update_fields=step_fields)


def _without_end_user(options: dict[str, Any]) -> dict[str, Any]:
    return {name: value for name, value in options.items() if name != "user"}


def _reward_given(call: Call) -> float | None:
    """The reward that sent a low-reward call to review: the lower of its step's own and its
    run's (a run reported failed without one: 0.0)."""
    step_reward, run_reward, outcome = (
        Call.objects.filter(pk=call.pk)
        .values_list("step__reward", "step__trajectory__reward", "step__trajectory__outcome")
        .get()
    )
    known = [float(r) for r in (step_reward, run_reward) if r is not None]
    if outcome == "failed" and run_reward is None:
        known.append(0.0)
    return min(known) if known else None


def captures_lost() -> list[uuid.UUID]:
    """Calls chosen for review whose item was never made (their process stopped between
    the log row and the capture, or the capture failed), and low-reward steps to capture."""
    now = timezone.now()
    return list(
        Call.objects.filter(
            # A low-reward step is captured by this sweep alone: no need to wait.
            Q(created_at__lt=now - _LOST_AFTER) | Q(capture=Call.Capture.LOW_REWARD),
            capture__in=CAPTURING,
            item__isnull=True,
            created_at__gte=now - _GIVE_UP_AFTER,
        )
        .order_by("created_at")
        .values_list("pk", flat=True)[:500]
    )


def low_reward_steps_mark() -> int:
    """Choose for review the calls of agent steps rewarded below their queue's bar (the step's
    own reward, its run's, or a run reported failed), where the queue asks for it: at most the
    queue's cap per run, its earliest steps, nothing from a run awaiting (or refused) a
    reviewer's approval, and nothing rewarded before the queue turned the rule on. The sweep
    then captures them as it captures any chosen call. Returns how many were chosen."""
    recent = Call.objects.filter(
        queue__capture_low_reward=True,
        queue__reward_threshold__isnull=False,
        step__isnull=False,
        created_at__gte=timezone.now() - _GIVE_UP_AFTER,
    ).filter(step__trajectory__approval__in=APPROVAL_ALLOWS_MEMORY)
    eligible = list(
        recent.filter(
            low_reward_q("step__", F("queue__reward_threshold")),
            _rewarded_since_the_rule(),
            capture=Call.Capture.NONE,
            item__isnull=True,
            status_code=200,
        )
        .order_by("step__trajectory_id", "step__position", "pk")
        .values_list("pk", "step__trajectory_id", "queue__low_reward_captures_per_run")
    )
    # Every low-reward capture the run ever had counts, whatever became of it (its item
    # deleted, found a duplicate, refused): the cap is the run's, and a slot is never freed.
    # The runs are locked while they are counted, so a sweep beside this one waits.
    chosen: list[uuid.UUID] = []
    with transaction.atomic():
        # Locked in one order (two sweeps at once never wait on each other's locks).
        runs = (
            Trajectory.objects.select_for_update()
            .filter(pk__in={run for _, run, _ in eligible})
            .order_by("pk")
        )
        taken = dict(runs.values_list("pk", "low_reward_captures"))
        added: Counter[uuid.UUID] = Counter()
        for call_id, run, cap in eligible:
            if run not in taken:  # deleted since the list was read
                continue
            if taken[run] + added[run] >= cap:
                continue
            # Conditional: nothing marked since the list was read is marked twice.
            marked = Call.objects.filter(pk=call_id, capture=Call.Capture.NONE).update(
                capture=Call.Capture.LOW_REWARD
            )
            if marked:
                added[run] += 1
                chosen.append(call_id)
        for run, count in added.items():
            Trajectory.objects.filter(pk=run).update(
                low_reward_captures=F("low_reward_captures") + count
            )
    return len(chosen)


def _rewarded_since_the_rule() -> Q:
    """Calls whose step or run was rewarded below the bar (or reported failed) at or after the
    moment their queue turned the rule on: it never reaches back to runs rewarded before it
    existed. A queue that turned it on before that moment was recorded has no bound."""
    bar = OuterRef("queue__reward_threshold")
    low = Feedback.objects.filter(
        Q(step=OuterRef("step")) | Q(trajectory=OuterRef("step__trajectory"), step__isnull=True),
        Q(reward__lt=bar) | Q(success=False),
        created_at__gte=OuterRef("queue__capture_low_reward_since"),
    )
    return Q(queue__capture_low_reward_since__isnull=True) | Q(Exists(low))


def item_deleted(*, item_id: int) -> None:
    """A captured call whose review item is deleted is not captured again by the sweep."""
    Call.objects.filter(item_id=item_id).update(capture=Call.Capture.REMOVED)
