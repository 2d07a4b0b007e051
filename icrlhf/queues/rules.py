"""What a queue's routing rules do, in words, from the rules as saved: the queue page's
summary, the routing page's next step, and the combinations the routing form refuses because
they would do nothing.

Some rules rest on facts the queue row does not hold: a fitted confidence (the generation
app's calibration) and a pause of automation by its audits (the review app). Those apps sit
above this one, so they are read where they live (`review.calibrations.routing_facts`:
the newest calibration, the pause, the decided items) and handed to `evidence_of`, once per
page; the form, the summary and the next step then all read the same `Evidence`."""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from icrlhf.queues.models import Item, Queue

# Why a captured call went to review (gateway.models.Call.Capture, which this app sits below;
# a test holds them equal).
SAMPLED, UNCOVERED, LOW_REWARD = "sampled", "uncovered", "low_reward"


class Fitted(Protocol):
    """A queue's newest calibration (generation.models.Calibration), as far as rules read it."""

    # For each target precision: {target, threshold (None: none promised yet),
    # more_items_needed, …} (generation.calibration.Recommendation).
    @property
    def recommendations(self) -> Any: ...

    # The memory-only confidence; None while none is fitted.
    @property
    def memory_fit(self) -> Any: ...


@dataclass(frozen=True)
class Readiness:
    """How far a queue is from a fitted confidence: its decided items against the fewest one
    is fitted on."""

    decided: int
    needed: int
    fitted: bool
    what: str  # the items counted, e.g. "decided items"
    purpose: str  # what they are needed for, e.g. "before a threshold can be recommended"
    soon: str  # when there are enough: what still has to happen

    @property
    def more(self) -> int:
        return max(self.needed - self.decided, 0)

    @property
    def sentence(self) -> str:
        """Where the count stands and what to do, in words; empty once fitted."""
        if self.fitted:
            return ""
        if not self.decided:
            return f"No {self.what} yet: {self.needed} are needed {self.purpose}."
        if self.more:
            return (
                f"{self.decided} of {self.needed} {self.what} needed {self.purpose}: "
                f"decide {self.more} more."
            )
        return f"{self.decided} {self.what}, enough: {self.soon}"


@dataclass(frozen=True)
class Recommended:
    """The threshold recommended for the lowest target precision that has one."""

    target: float
    threshold: float


@dataclass(frozen=True)
class Evidence:
    """What a queue's rules rest on beyond its own fields."""

    confidence: Readiness  # the ranking's: what automation compares with its threshold
    memory_confidence: Readiness  # memory's alone: what answering by confidence reads
    recommended: Recommended | None
    # Without a recommendation: the target closest to one and about how many more decided
    # items above a threshold would prove it (None when no rate reaches any target yet).
    short_of: tuple[float, int] | None
    paused: bool  # automation paused by its audits until a curator resumes it


def evidence_of(
    *,
    calibration: Fitted | None,
    paused: bool,
    needed: int,
    decided: int,
    decided_from_memory: int,
) -> Evidence:
    """The facts the rules rest on: `calibration` is the queue's newest one (None: no
    confidence fitted yet), `needed` the fewest decided items a confidence is fitted on,
    `decided` the items it is fitted on (`review.models.decided_items`) and
    `decided_from_memory` those with an answer from memory among their candidates."""
    recommendations: Sequence[Mapping[str, Any]] = (
        (calibration.recommendations or []) if calibration is not None else []
    )
    recommended = min(
        (
            Recommended(target=r["target"], threshold=r["threshold"])
            for r in recommendations
            if r.get("threshold") is not None
        ),
        key=lambda r: r.target,
        default=None,
    )
    short = [
        (r["target"], r["more_items_needed"])
        for r in recommendations
        if r.get("threshold") is None and r.get("more_items_needed") is not None
    ]
    return Evidence(
        confidence=Readiness(
            decided=decided,
            needed=needed,
            fitted=calibration is not None,
            what="decided items",
            purpose="before a threshold can be recommended",
            soon="the confidence is fitted within minutes, once reviewers have both kept and "
            "replaced some first candidates.",
        ),
        memory_confidence=Readiness(
            decided=decided_from_memory,
            needed=needed,
            fitted=calibration is not None and bool(calibration.memory_fit),
            what="decided items with an answer from memory among their candidates",
            purpose="before memory alone can answer by confidence",
            soon="memory's confidence is fitted within minutes, once reviewers have both kept "
            "and turned down some of its answers.",
        ),
        recommended=recommended,
        short_of=min(short, key=lambda pair: pair[1], default=None),
        paused=paused,
    )


def rule_refusals(*, values: Mapping[str, Any], evidence: Evidence) -> dict[str, str]:
    """The routing rules among `values` (a form's cleaned data) that would do nothing, each
    with the sentence that says why and what to do instead."""
    refused = {}
    if values.get("auto_apply_threshold") is not None and not evidence.confidence.fitted:
        refused["auto_apply_threshold"] = (
            "Automation cannot run yet: there is no confidence to compare with a threshold. "
            f"{evidence.confidence.sentence} Leave this empty until then."
        )
    if values.get("memory_answer_confidence") is not None and not (
        evidence.memory_confidence.fitted
    ):
        refused["memory_answer_confidence"] = (
            "Answering from memory by confidence cannot run yet: memory alone has no fitted "
            f"confidence. {evidence.memory_confidence.sentence} Leave this empty until then "
            "(answering by similarity works now)."
        )
    # Only once the bar itself passed its own checks (else that error says what is wrong).
    if (
        values.get("capture_low_reward")
        and "reward_threshold" in values
        and values["reward_threshold"] is None
    ):
        refused["capture_low_reward"] = (
            "Low-reward review needs a reward bar to compare runs with: set “store rewarded "
            "runs as memory at reward”, or untick this."
        )
    return refused


@dataclass(frozen=True)
class Captured:
    """Captured calls waiting for review, and how many of them a rule since turned off took."""

    waiting: int
    earlier: int

    @property
    def sentence(self) -> str:
        count = f"{self.waiting} captured call{'' if self.waiting == 1 else 's'} to review"
        if not self.waiting:
            return "No captured calls wait for review."
        if not self.earlier:
            return count
        if self.earlier == self.waiting:
            rules = "a rule" if self.waiting == 1 else "rules"
            return f"{count}, captured earlier under {rules} since turned off"
        return f"{count} ({self.earlier} captured earlier, under a rule since turned off)"


@dataclass(frozen=True)
class RulesSummary:
    """The saved rules in words (phrases for the queue page's summary line), the captured
    calls waiting, and the one thing to do next."""

    review: str
    holdout: str
    memory: str
    automation: str
    rewards: str
    captured: Captured
    next_step: str


def low_reward_review_on(queue: Queue) -> bool:
    return queue.capture_low_reward and queue.reward_threshold is not None


def _capturing(queue: Queue) -> set[str]:
    """The capture reasons whose rule is on."""
    on = {
        SAMPLED: bool(queue.capture_percent),
        UNCOVERED: queue.capture_below_similarity is not None,
        LOW_REWARD: low_reward_review_on(queue),
    }
    return {reason for reason, yes in on.items() if yes}


def captured_of(*, queue: Queue) -> Captured:
    """Captured gateway calls not decided yet (still generating, or ready for review), and
    those among them whose rule is off now."""
    reason_of: dict[int, str] = {}
    for item_id, capture in queue.items.filter(
        source=Item.Source.GATEWAY, status__in=[Item.Status.GENERATING, Item.Status.READY]
    ).values_list("pk", "calls__capture"):
        if item_id not in reason_of or capture in (SAMPLED, UNCOVERED, LOW_REWARD):
            reason_of[item_id] = capture or ""
    on = _capturing(queue)
    # A capture whose reason is not known (its call since purged) is "earlier" only when no
    # rule captures now.
    earlier = sum(
        reason not in on if reason in (SAMPLED, UNCOVERED, LOW_REWARD) else not on
        for reason in reason_of.values()
    )
    return Captured(waiting=len(reason_of), earlier=earlier)


def _number(value: float) -> str:
    return f"{value:g}"


def _listed(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else f"{', '.join(parts[:-1])} and {parts[-1]}"


def _review(queue: Queue) -> str:
    parts = []
    if queue.capture_percent:
        share = queue.capture_percent
        parts.append("every call" if share == 100 else f"{share}% of calls, at random")
    if queue.capture_below_similarity is not None:
        threshold = _number(queue.capture_below_similarity)
        parts.append(f"every call memory does not cover (similarity < {threshold})")
    if low_reward_review_on(queue):
        bar = _number(queue.reward_threshold or 0.0)
        per_run = queue.low_reward_captures_per_run
        parts.append(f"the steps of runs rewarded below {bar} (at most {per_run} per run)")
    said = f"reviews {_listed(parts)}" if parts else "captures no calls for review"
    if queue.capture_low_reward and queue.reward_threshold is None:
        said += " (low-reward review is ticked but has no reward bar, so it captures nothing)"
    return said


def _holdout(queue: Queue) -> str:
    if not queue.holdout_percent:
        return "no holdout"
    said = f"{queue.holdout_percent}% of calls held out without memory"
    if not _capturing(queue):
        said += " (compared only on rewarded runs: no calls are captured for review)"
    return said


def _memory(queue: Queue, evidence: Evidence) -> str:
    rules = []
    if queue.memory_answer_threshold is not None:
        rules.append(f"similarity ≥ {_number(queue.memory_answer_threshold)}")
    confidence = queue.memory_answer_confidence
    waiting = confidence is not None and not evidence.memory_confidence.fitted
    if confidence is not None and not waiting:
        rules.append(f"confidence ≥ {_number(confidence)}")
    said = f"answers from memory at {' or '.join(rules)}" if rules else "always asks the model"
    if rules and queue.memory_answers_need_approval:
        said += ", approved examples only"
    if waiting and confidence is not None:
        readiness = evidence.memory_confidence
        said += (
            f" (answering at confidence ≥ {_number(confidence)} waits for memory's own "
            f"confidence: {readiness.decided} of {readiness.needed} decided items had an "
            "answer from memory)"
        )
    return said


def _automation(queue: Queue, evidence: Evidence) -> str:
    threshold = queue.auto_apply_threshold
    if threshold is None:
        return "off: every item is reviewed"
    at = _number(threshold)
    if evidence.paused:
        return (
            f"paused by its audits (threshold {at}): every item is reviewed until a curator "
            "resumes it"
        )
    readiness = evidence.confidence
    if not readiness.fitted:
        return (
            f"set at confidence ≥ {at} but cannot run yet: no confidence is fitted "
            f"({readiness.decided} of {readiness.needed} decided items); every item is reviewed"
        )
    audits = (
        f"audits {queue.audit_percent}%"
        if queue.audit_percent
        else "audits none, so nothing watches its precision"
    )
    return f"applies the first candidate without review at confidence ≥ {at}, {audits}"


def _rewards(queue: Queue) -> str:
    if queue.reward_threshold is None:
        return "kept, but no run reaches memory (no reward bar)"
    bar = _number(queue.reward_threshold)
    said = f"rewarded runs become memory (preferred at reward ≥ {bar}, rejected below)"
    if queue.rewards_need_approval:
        said += " once a reviewer approves them"
    return said


def _percent(value: float) -> str:
    return f"{value * 100:g}%"


def _next_step(queue: Queue, evidence: Evidence) -> str:
    """The one thing a curator should do next: first the rules that do nothing, then what
    stands between the queue and the next rule it could use."""
    confidence, memory = evidence.confidence, evidence.memory_confidence
    if queue.capture_low_reward and queue.reward_threshold is None:
        return (
            "Next: set a reward bar (“store rewarded runs as memory at reward”) to turn on "
            "low-reward review, or untick it."
        )
    if queue.auto_apply_threshold is not None and not confidence.fitted:
        if confidence.more:
            return (
                f"Next: decide {confidence.more} more items in this queue so a confidence can "
                "be fitted: automation is set but cannot run until then (or clear its "
                "threshold)."
            )
        return f"Next: keep deciding items: {confidence.soon} Automation cannot run until then."
    if queue.memory_answer_confidence is not None and not memory.fitted:
        if memory.more:
            return (
                f"Next: decide {memory.more} more items that have an answer from memory among "
                "their candidates: answering from memory by confidence cannot run until then "
                "(or clear its confidence)."
            )
        return (
            f"Next: keep deciding items: {memory.soon} Answering from memory by confidence "
            "cannot run until then."
        )
    if evidence.paused:
        return "Next: read what the audits showed, then raise the threshold or resume automation."
    if not confidence.fitted:
        if not confidence.more:
            return f"Next: keep deciding items: {confidence.soon}"
        if not _capturing(queue):
            return (
                "Next: capture calls for review (a capture share or a coverage threshold) and "
                f"decide {confidence.more} more items, so a threshold can be recommended."
            )
        return (
            f"Next: decide {confidence.more} more items in this queue so a threshold can be "
            "recommended."
        )
    if queue.auto_apply_threshold is None:
        if evidence.recommended is not None:
            return (
                "Next: automation can start when you wish: set “apply automatically at” to "
                f"{_number(evidence.recommended.threshold)} for "
                f"{_percent(evidence.recommended.target)} precision (the recommendations below)."
            )
        if evidence.short_of is not None:
            target, more = evidence.short_of
            return (
                f"Next: decide about {more} more items so a threshold can promise "
                f"{_percent(target)} precision."
            )
        return "Next: decide more items: no threshold is precise enough on this queue yet."
    if not queue.audit_percent:
        return "Next: set an audit share: with none, nothing watches automation's precision."
    if not queue.holdout_percent:
        return "Next: set a holdout share (a few percent) to measure what memory is worth."
    return "Nothing to do next: every rule runs as set."


def rules_summary(*, queue: Queue, evidence: Evidence) -> RulesSummary:
    """The queue's saved rules, as they act given `evidence`."""
    return RulesSummary(
        review=_review(queue),
        holdout=_holdout(queue),
        memory=_memory(queue, evidence),
        automation=_automation(queue, evidence),
        rewards=_rewards(queue),
        captured=captured_of(queue=queue),
        next_step=_next_step(queue, evidence),
    )
