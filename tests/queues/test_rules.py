"""The routing rules in words (queues/rules.py): one function says what the saved rules do,
given what they rest on (a fitted confidence, a pause, the decided items), so the queue page
never claims a rule runs that cannot, nor that no call is captured while one rule captures."""

from dataclasses import dataclass, field
from typing import Any

import pytest
from django.utils import timezone

from icrlhf.gateway.models import Call
from icrlhf.generation.models import Candidate, Generation
from icrlhf.queues import rules
from icrlhf.queues.models import Item, Queue
from icrlhf.review.calibrations import MIN_ITEMS
from icrlhf.review.models import decided_items
from tests.factories import DecisionFactory, ItemFactory, QueueFactory, ready_generation

pytestmark = pytest.mark.django_db


@dataclass
class Fit:
    """A calibration as the rules read it."""

    recommendations: list[dict[str, Any]] = field(default_factory=list)
    memory_fit: dict[str, Any] | None = None


RECOMMENDED = {"target": 0.9, "threshold": 0.884, "more_items_needed": None}
SHORT = {"target": 0.95, "threshold": None, "more_items_needed": 41}


def evidence(queue: Queue, *, fit: Fit | None = None, paused: bool = False) -> rules.Evidence:
    return rules.evidence_of(
        calibration=fit,
        paused=paused,
        needed=MIN_ITEMS,
        decided=decided_items(queue=queue),
        decided_from_memory=decided_items(queue=queue, from_memory=True),
    )


def summary(queue: Queue, **facts: Any) -> rules.RulesSummary:
    return rules.rules_summary(queue=queue, evidence=evidence(queue, **facts))


def decided(queue: Queue, count: int, *, from_memory: bool = False) -> None:
    """`count` items decided on a ranked generation (what a confidence is fitted on)."""
    for _ in range(count):
        item = ItemFactory(queue=queue, status=Item.Status.DECIDED)
        generation = ready_generation(item, ["an answer", "another"])
        Generation.objects.filter(pk=generation.pk).update(ranked_at=timezone.now())
        if from_memory:
            generation.candidates.filter(position=0).update(source=Candidate.Source.MEMORY)
        DecisionFactory(generation=generation, item=item)


def waiting_capture(queue: Queue, reason: str) -> Item:
    """A gateway call captured for `reason`, its item ready for review."""
    item = ItemFactory(queue=queue, source=Item.Source.GATEWAY, status=Item.Status.READY)
    Call.objects.create(
        queue=queue,
        source=Call.Source.MODEL,
        memory=Call.Memory.USED,
        request_text=item.input_text,
        capture=reason,
        item=item,
    )
    return item


def test_the_capture_reasons_it_names_are_the_gateways() -> None:
    assert (rules.SAMPLED, rules.UNCOVERED, rules.LOW_REWARD) == (
        Call.Capture.SAMPLED,
        Call.Capture.UNCOVERED,
        Call.Capture.LOW_REWARD,
    )


def test_low_reward_review_alone_is_a_capture_not_captures_no_calls() -> None:
    queue = QueueFactory(capture_low_reward=True, reward_threshold=0.5)
    said = summary(queue).review
    assert said == "reviews the steps of runs rewarded below 0.5 (at most 3 per run)"
    assert "captures no calls" not in said


def test_every_capture_rule_is_named_together() -> None:
    queue = QueueFactory(
        capture_percent=5,
        capture_below_similarity=0.55,
        capture_low_reward=True,
        reward_threshold=0.5,
    )
    assert summary(queue).review == (
        "reviews 5% of calls, at random, every call memory does not cover (similarity < 0.55) "
        "and the steps of runs rewarded below 0.5 (at most 3 per run)"
    )


def test_low_reward_review_without_a_bar_is_said_to_capture_nothing() -> None:
    """Saved before the form refused it: the summary says it does nothing, and the next
    step is to set the bar."""
    queue = QueueFactory(capture_low_reward=True, reward_threshold=None)
    said = summary(queue)
    assert said.review == (
        "captures no calls for review (low-reward review is ticked but has no reward bar, "
        "so it captures nothing)"
    )
    assert said.next_step.startswith("Next: set a reward bar")


def test_automation_without_a_confidence_is_said_not_to_run() -> None:
    queue = QueueFactory(auto_apply_threshold=0.9, capture_percent=10)
    decided(queue, 12)
    said = summary(queue)
    assert said.automation == (
        "set at confidence ≥ 0.9 but cannot run yet: no confidence is fitted "
        "(12 of 30 decided items); every item is reviewed"
    )
    assert "applies" not in said.automation
    assert said.next_step == (
        "Next: decide 18 more items in this queue so a confidence can be fitted: automation "
        "is set but cannot run until then (or clear its threshold)."
    )


def test_paused_automation_is_said_to_be_paused() -> None:
    queue = QueueFactory(auto_apply_threshold=0.9)
    said = summary(queue, fit=Fit([RECOMMENDED]), paused=True)
    assert said.automation.startswith("paused by its audits (threshold 0.9)")
    assert said.next_step.startswith("Next: read what the audits showed")


def test_running_automation_says_its_threshold_and_audits() -> None:
    queue = QueueFactory(auto_apply_threshold=0.9, audit_percent=10)
    assert summary(queue, fit=Fit([RECOMMENDED])).automation == (
        "applies the first candidate without review at confidence ≥ 0.9, audits 10%"
    )
    queue.audit_percent = 0
    unwatched = summary(queue, fit=Fit([RECOMMENDED]))
    assert unwatched.automation.endswith("audits none, so nothing watches its precision")
    assert unwatched.next_step.startswith("Next: set an audit share")
    assert summary(QueueFactory(auto_apply_threshold=None)).automation == (
        "off: every item is reviewed"
    )


def test_answering_by_confidence_waits_for_memorys_own_confidence() -> None:
    queue = QueueFactory(memory_answer_confidence=0.9)
    decided(queue, 9, from_memory=True)
    decided(queue, 3)
    waiting = summary(queue, fit=Fit([RECOMMENDED]))
    assert waiting.memory == (
        "always asks the model (answering at confidence ≥ 0.9 waits for memory's own "
        "confidence: 9 of 30 decided items had an answer from memory)"
    )
    assert waiting.next_step.startswith("Next: decide 21 more items that have an answer from")
    queue.memory_answer_threshold = 0.95
    assert summary(queue, fit=Fit([RECOMMENDED])).memory.startswith(
        "answers from memory at similarity ≥ 0.95 (answering at confidence ≥ 0.9 waits"
    )
    fitted = summary(queue, fit=Fit([RECOMMENDED], memory_fit={"items": 40}))
    assert fitted.memory == "answers from memory at similarity ≥ 0.95 or confidence ≥ 0.9"


def test_a_holdout_with_nothing_captured_says_what_it_is_compared_on() -> None:
    assert summary(QueueFactory(holdout_percent=10)).holdout == (
        "10% of calls held out without memory (compared only on rewarded runs: no calls are "
        "captured for review)"
    )
    assert summary(QueueFactory(holdout_percent=10, capture_percent=5)).holdout == (
        "10% of calls held out without memory"
    )
    assert summary(QueueFactory(holdout_percent=0)).holdout == "no holdout"


def test_captured_calls_under_a_rule_since_turned_off_are_said_to_be_earlier() -> None:
    queue = QueueFactory(capture_percent=0, capture_below_similarity=None)
    waiting_capture(queue, Call.Capture.SAMPLED)
    said = summary(queue)
    assert said.review == "captures no calls for review"
    assert said.captured == rules.Captured(waiting=1, earlier=1)
    assert said.captured.sentence == (
        "1 captured call to review, captured earlier under a rule since turned off"
    )

    queue.capture_below_similarity = 0.5
    queue.save()
    waiting_capture(queue, Call.Capture.UNCOVERED)
    decided_capture = waiting_capture(queue, Call.Capture.UNCOVERED)
    Item.objects.filter(pk=decided_capture.pk).update(status=Item.Status.DECIDED)
    assert summary(queue).captured.sentence == (
        "2 captured calls to review (1 captured earlier, under a rule since turned off)"
    )
    queue.capture_percent = 5
    assert summary(queue).captured.sentence == "2 captured calls to review"


def test_a_capture_whose_call_is_gone_is_earlier_only_when_nothing_captures() -> None:
    queue = QueueFactory(capture_percent=5)
    ItemFactory(queue=queue, source=Item.Source.GATEWAY, status=Item.Status.GENERATING)
    assert summary(queue).captured == rules.Captured(waiting=1, earlier=0)
    queue.capture_percent = 0
    assert summary(queue).captured == rules.Captured(waiting=1, earlier=1)
    assert rules.Captured(waiting=0, earlier=0).sentence == "No captured calls wait for review."


def test_decided_items_are_standing_decisions_on_ranked_generations() -> None:
    queue = QueueFactory()
    decided(queue, 2)
    decided(queue, 1, from_memory=True)
    unranked = ItemFactory(queue=queue)
    DecisionFactory(generation=ready_generation(unranked, ["a"]), item=unranked)
    superseded = ItemFactory(queue=queue)
    generation = ready_generation(superseded, ["b"])
    Generation.objects.filter(pk=generation.pk).update(ranked_at=timezone.now())
    DecisionFactory(generation=generation, item=superseded, superseded_at=timezone.now())
    decided(QueueFactory(), 4)  # another queue's
    assert decided_items(queue=queue) == 3
    assert decided_items(queue=queue, from_memory=True) == 1


@pytest.mark.parametrize(
    ("count", "sentence"),
    [
        (0, "No decided items yet: 30 are needed before a threshold can be recommended."),
        (
            12,
            "12 of 30 decided items needed before a threshold can be recommended: decide 18 more.",
        ),
        (
            30,
            "30 decided items, enough: the confidence is fitted within minutes, once reviewers "
            "have both kept and replaced some first candidates.",
        ),
    ],
)
def test_readiness_says_how_many_items_are_decided_and_how_many_more(
    count: int, sentence: str
) -> None:
    queue = QueueFactory(capture_percent=5)
    decided(queue, count)
    readiness = evidence(queue).confidence
    assert (readiness.decided, readiness.more, readiness.sentence) == (
        count,
        max(30 - count, 0),
        sentence,
    )
    assert evidence(queue, fit=Fit()).confidence.sentence == ""  # fitted: nothing to say


def test_the_next_step_leads_from_deciding_to_automation_to_a_holdout() -> None:
    queue = QueueFactory(capture_percent=0, capture_below_similarity=None)
    decided(queue, 12)
    assert summary(queue).next_step == (
        "Next: capture calls for review (a capture share or a coverage threshold) and decide "
        "18 more items, so a threshold can be recommended."
    )
    queue.capture_percent = 5
    assert summary(queue).next_step == (
        "Next: decide 18 more items in this queue so a threshold can be recommended."
    )
    assert summary(queue, fit=Fit([SHORT])).next_step == (
        "Next: decide about 41 more items so a threshold can promise 95% precision."
    )
    assert summary(queue, fit=Fit([RECOMMENDED, SHORT])).next_step == (
        "Next: automation can start when you wish: set “apply automatically at” to 0.884 for "
        "90% precision (the recommendations below)."
    )
    queue.auto_apply_threshold = 0.884
    assert summary(queue, fit=Fit([RECOMMENDED])).next_step.startswith("Next: set a holdout share")
    queue.holdout_percent = 5
    assert summary(queue, fit=Fit([RECOMMENDED])).next_step == (
        "Nothing to do next: every rule runs as set."
    )


def test_refusals_name_each_rule_that_would_do_nothing() -> None:
    queue = QueueFactory()
    decided(queue, 12)
    values = {
        "auto_apply_threshold": 0.9,
        "memory_answer_confidence": 0.9,
        "capture_low_reward": True,
        "reward_threshold": None,
    }
    refused = rules.rule_refusals(values=values, evidence=evidence(queue))
    assert refused["auto_apply_threshold"] == (
        "Automation cannot run yet: there is no confidence to compare with a threshold. "
        "12 of 30 decided items needed before a threshold can be recommended: decide 18 more. "
        "Leave this empty until then."
    )
    assert refused["memory_answer_confidence"].startswith(
        "Answering from memory by confidence cannot run yet"
    )
    assert refused["capture_low_reward"].startswith("Low-reward review needs a reward bar")
    fitted = evidence(queue, fit=Fit([RECOMMENDED], memory_fit={"items": 40}))
    meaningful = {**values, "reward_threshold": 0.5}
    assert rules.rule_refusals(values=meaningful, evidence=fitted) == {}
    # A bar refused by its own checks is not in the values: that error says what is wrong.
    assert "capture_low_reward" not in rules.rule_refusals(
        values={"capture_low_reward": True}, evidence=fitted
    )
