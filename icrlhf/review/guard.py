"""Automation watches itself. Its audits (the share of automatically applied items that still
goes to review) are the online check of the precision it promises: at a threshold t, items at
least t likely to be accepted, so at least t of them right. A sequential test on the audits
pauses automation for the queue when they show that promise broken; a curator resumes it.

The test is Wald's sequential probability ratio test, one-sided: the audits since automation
started at the current threshold (or was last resumed) weigh "precision is the threshold"
against "precision is DROP lower", and automation pauses once the likelihood ratio reaches
1/ALPHA. Why this test: the audits are looked at after every one of them, for as long as
automation runs, and a fixed-sample test or an interval recomputed each time would then raise
false alarms far above its nominal rate. While the precision is at least the threshold, the
ratio is a nonnegative supermartingale, so by Ville's inequality it ever reaches 1/ALPHA with a
chance of at most ALPHA, however long it watches: false alarms stay below 5%. Among tests with
that guarantee, it needs the fewest audits on average to catch a drop of the size it is tuned
for (Wald and Wolfowitz). Its cost: after a long good stretch the ratio sits low, and a later
drop takes longer to show; a new threshold or a resume starts it afresh."""

import math
from collections.abc import Sequence
from dataclasses import dataclass

from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.utils import timezone

from icrlhf.generation.calibration import precision_upper_bound
from icrlhf.integrations import webhooks
from icrlhf.kinds.labels import answer_key
from icrlhf.queues.models import Queue
from icrlhf.review.models import Automation, AutomationPause, Decision, standing_filter

ALPHA = 0.05  # the chance of a false alarm, over the whole time automation runs
DROP = 0.10  # the fall in precision the test is tuned to catch quickly
PAUSED_EVENT = "automation.paused"


@dataclass(frozen=True)
class Watch:
    """Where the test stands for a queue's current threshold."""

    target: float  # the precision promised: the threshold
    audits: int
    agreed: int
    log_ratio: float  # pauses at log(1/ALPHA)
    upper_bound: float  # the audited precision's one-sided 95% upper bound (1.0: no audits)
    audits_to_detect: float  # expected audits to pause, from the start, at target − DROP

    @property
    def alarm(self) -> bool:
        return self.log_ratio >= math.log(1 / ALPHA)


# A threshold of 1.0 promises every item right: tested as 99.9%, so that one audit not kept
# weighs heavily but the ratio stays finite.
_HIGHEST_TARGET = 0.999


def _hypotheses(target: float) -> tuple[float, float]:
    """The precision promised, as tested, and the one DROP lower it is weighed against."""
    promised = min(target, _HIGHEST_TARGET)
    return promised, max(promised - DROP, 0.01)


def log_ratio(outcomes: Sequence[bool], target: float) -> float:
    """The log likelihood ratio of "precision is target − DROP" against "it is target" after
    these audits (True: the audit kept what was applied)."""
    target, worse = _hypotheses(target)
    right, wrong = math.log(worse / target), math.log((1 - worse) / (1 - target))
    return sum(right if kept else wrong for kept in outcomes)


def audits_to_detect(target: float, precision: float) -> float:
    """Expected audits until a pause when the precision really is `precision` (< target), by
    Wald's identity: the boundary plus the mean overshoot (about half a wrong audit's step),
    over the ratio's drift per audit (inf when it does not drift up)."""
    target, worse = _hypotheses(target)
    kept, wrong = math.log(worse / target), math.log((1 - worse) / (1 - target))
    drift = precision * kept + (1 - precision) * wrong
    return (math.log(1 / ALPHA) + wrong / 2) / drift if drift > 0 else math.inf


def watch_of(target: float, outcomes: Sequence[bool]) -> Watch:
    agreed = sum(outcomes)
    return Watch(
        target=target,
        audits=len(outcomes),
        agreed=agreed,
        log_ratio=log_ratio(outcomes, target),
        upper_bound=precision_upper_bound(agreed, len(outcomes)),
        audits_to_detect=audits_to_detect(target, _hypotheses(target)[1]),
    )


def audits_since_start(queue: Queue, threshold: float) -> list[bool]:
    """The outcomes of the audits of automations at this threshold (the queue's current one),
    since automation started at it or was last resumed, in the order they were decided."""
    automations = (
        Automation.objects.standing()
        .filter(
            standing_filter("audit_decision"),
            item__queue=queue,
            audit=True,
            audit_decision__isnull=False,
            threshold=threshold,
        )
        .select_related("audit_decision")
    )
    # Watched afresh from the latest resume (while paused, the pause) or change of threshold:
    # only items applied since, audited since.
    starts = [
        change.changed_at
        for change in queue.routing_changes.order_by("-changed_at")
        if "auto_apply_threshold" in change.changes
    ][:1]
    latest = queue.automation_pauses.order_by("-paused_at").first()
    if latest is not None:
        starts.append(latest.resumed_at or latest.paused_at)
    if starts:
        since = max(starts)
        automations = automations.filter(created_at__gt=since, audit_decision__created_at__gt=since)
    return [
        audit_agreed(automation) is True
        for automation in automations.order_by("audit_decision__created_at", "pk")
    ]


def audit_agreed(automation: Automation) -> bool | None:
    """Whether the audit kept what was applied (None: not audited yet)."""
    decision = automation.audit_decision
    if decision is None:
        return None
    return decision.verdict != Decision.Verdict.NONE_ACCEPTABLE and answer_key(
        decision.final_text
    ) == answer_key(automation.final_text)


def watch(queue: Queue) -> Watch | None:
    """The test's state for the queue (None: automation is off)."""
    if queue.auto_apply_threshold is None:
        return None
    threshold = queue.auto_apply_threshold
    return watch_of(threshold, audits_since_start(queue, threshold))


def pause_active(queue: Queue) -> AutomationPause | None:
    return queue.automation_pauses.filter(resumed_at__isnull=True).first()


def automation_check(*, queue_id: int) -> AutomationPause | None:
    """After an audit: pause the queue's automation if the test says its promise is broken
    (once: a paused queue waits for a curator). Returns the new pause. Runs inside the audit
    decision's transaction."""
    # Serialises concurrent audits' checks; "no key": rows that point at the queue (new calls
    # and items) are not held up by it.
    queue = Queue.objects.select_for_update(no_key=True).get(pk=queue_id)
    if pause_active(queue) is not None:
        return None
    state = watch(queue)
    if state is None or not state.alarm:
        return None
    try:
        with transaction.atomic():  # a savepoint: the audit's decision stands either way
            return AutomationPause.objects.create(
                queue=queue,
                target=state.target,
                audits=state.audits,
                agreed=state.agreed,
                log_ratio=state.log_ratio,
                upper_bound=state.upper_bound,
            )
    except IntegrityError:  # another audit paused it a moment before
        return None


@transaction.atomic
def automation_resume(*, queue: Queue, actor: User) -> AutomationPause | None:
    """A curator starts automation again; its test starts afresh from here."""
    pause = pause_active(queue)
    if pause is None:
        return None
    pause.resumed_at, pause.resumed_by = timezone.now(), actor
    pause.save(update_fields=["resumed_at", "resumed_by"])
    return pause


def pause_webhook_send(*, pause_id: int) -> None:
    pause = AutomationPause.objects.select_related("queue").get(pk=pause_id)
    queue = pause.queue
    if not queue.webhook_url:
        return
    webhooks.post_signed(
        url=queue.webhook_url,
        secret=queue.webhook_secret,
        event=PAUSED_EVENT,
        payload={
            "event": PAUSED_EVENT,
            "queue": queue.slug,
            "paused_at": pause.paused_at.isoformat(),
            "target_precision": pause.target,
            "audits": pause.audits,
            "audits_kept": pause.agreed,
            "precision_upper_bound": pause.upper_bound,
            "resumed_at": pause.resumed_at.isoformat() if pause.resumed_at else None,
        },
    )
