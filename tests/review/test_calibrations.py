"""Fitting a queue's calibration on its decided items."""

import random
from typing import Any

import pytest
from django.utils import timezone

from icrlhf.generation.models import Calibration, Generation
from icrlhf.generation.ranking import FEATURES, PRIOR_COEFFICIENTS
from icrlhf.queues.models import Item
from icrlhf.review import calibrations
from tests.factories import DecisionFactory, ItemFactory, ready_generation

pytestmark = pytest.mark.django_db


def decided(queue: Any, rng: random.Random, *, right_first: float) -> None:
    """An item with two ranked candidates; the one memory voted for is what the reviewer
    kept with probability `right_first`, else the other one (or none acceptable)."""
    item = ItemFactory(queue=queue, status="decided")
    generation = ready_generation(item, ["voted answer", "other answer"])
    Generation.objects.filter(pk=generation.pk).update(ranked_at=timezone.now())
    voted, other = generation.candidates.order_by("position")
    vote = rng.uniform(0.5, 1.0)
    for candidate, features in (
        (voted, {"vote": vote, "support": 0.9, "memory": 1.0}),
        (other, {"vote": 1 - vote, "support": 0.3, "memory": 0.0}),
    ):
        candidate.ranking_features = dict.fromkeys(FEATURES, 0.0) | features
        candidate.save()
    draw = rng.random()
    if draw < right_first:
        DecisionFactory(
            generation=generation,
            verdict="chosen",
            chosen_candidate=voted,
            final_text=" Voted  answer",
        )
    elif draw < right_first + (1 - right_first) / 2:
        DecisionFactory(
            generation=generation,
            verdict="edited",
            chosen_candidate=voted,
            final_text="other answer",
        )
    else:
        DecisionFactory(generation=generation, verdict="none_acceptable")


def test_a_candidate_counts_as_accepted_when_it_is_what_the_reviewer_kept(queue: Any) -> None:
    decided(queue, random.Random(1), right_first=1.0)
    (sample,) = calibrations.samples_of(queue)
    assert sample.accepted == [True, False]  # case and spacing aside, the same answer
    rng = random.Random(5)
    while len(calibrations.samples_of(queue)) < 6:
        decided(queue, rng, right_first=0.0)  # the other answer kept, or none acceptable
    later = [tuple(s.accepted) for s in calibrations.samples_of(queue)[1:]]
    assert set(later) == {(False, True), (False, False)}


def test_too_few_decided_items_get_no_calibration(queue: Any) -> None:
    rng = random.Random(2)
    for _ in range(calibrations.MIN_ITEMS - 1):
        decided(queue, rng, right_first=0.7)
    assert calibrations.calibration_fit(queue=queue) is None
    assert calibrations.calibrations_refit() == []


def test_a_history_where_the_first_candidate_was_always_right_is_not_enough(queue: Any) -> None:
    """All accepted says little about how often it is wrong: no confidence of ~100% from it."""
    rng = random.Random(7)
    for _ in range(calibrations.MIN_ITEMS * 2):
        decided(queue, rng, right_first=1.0)
    assert calibrations.calibration_fit(queue=queue) is None


def test_the_fit_gives_a_confidence_that_matches_what_reviewers_did(queue: Any) -> None:
    rng = random.Random(3)
    for _ in range(200):
        decided(queue, rng, right_first=0.8)
    calibration = calibrations.calibration_fit(queue=queue)
    assert calibration is not None
    assert (calibration.items, calibration.candidates) == (200, 400)
    assert calibration.accepted_share == pytest.approx(0.8, abs=0.07)
    # Measured forward, the early blocks are judged by fits on few items: noisier than
    # interleaved folds were, and honest about it.
    assert calibration.ece is not None and calibration.ece < 0.12
    assert calibration.coefficients[1 + FEATURES.index("vote")] > 0
    at_half = next(p for p in calibration.curve if p["threshold"] == 0.5)
    assert at_half["coverage"] > 0.9 and at_half["precision"] == pytest.approx(0.8, abs=0.08)


def test_a_fit_that_ranks_worse_than_the_prior_keeps_the_prior(
    queue: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Early decisions (made while memory was empty) can teach a ranking that is worse than
    the prior: then the prior ranks, and only the confidence is fitted."""
    rng = random.Random(4)
    for _ in range(calibrations.MIN_ITEMS):
        decided(queue, rng, right_first=0.7)
    backwards = [0.0] * (len(FEATURES) + 1)
    backwards[1 + FEATURES.index("vote")] = -5.0  # a fit that prefers what memory voted against
    fit = calibrations._fit
    monkeypatch.setattr(
        calibrations,
        "_fit",
        lambda samples, names=FEATURES: backwards if names == FEATURES else fit(samples, names),
    )
    calibration = calibrations.calibration_fit(queue=queue)
    assert calibration is not None
    assert calibration.coefficients == list(PRIOR_COEFFICIENTS)
    assert calibration.accepted_share == pytest.approx(0.7, abs=0.15)  # the prior's tops


def test_the_periodic_refit_waits_for_enough_new_decisions(queue: Any) -> None:
    rng = random.Random(6)
    for _ in range(calibrations.MIN_ITEMS):
        decided(queue, rng, right_first=0.7)
    # Items decided on a generation that was never ranked teach nothing and start no refit.
    unranked = ItemFactory(queue=queue, status="decided")
    DecisionFactory(generation=ready_generation(unranked, ["x"]))
    assert calibrations.calibrations_refit() == [queue.pk]
    for _ in range(calibrations.REFIT_EVERY - 1):
        decided(queue, rng, right_first=0.7)
    assert calibrations.calibrations_refit() == []
    decided(queue, rng, right_first=0.7)
    assert calibrations.calibrations_refit() == [queue.pk]
    assert Calibration.objects.filter(queue=queue).count() == 2


def test_the_bound_on_precision_is_the_exact_clopper_pearson_one() -> None:
    from icrlhf.generation.calibration import precision_lower_bound

    # Textbook values: 95 of 100 right is at least 89.8% with 95% confidence; 59 of 59 is
    # the fewest all-right items that prove 95%; nothing right proves nothing.
    assert precision_lower_bound(95, 100) == pytest.approx(0.8977, abs=1e-4)
    assert precision_lower_bound(59, 59) >= 0.95 > precision_lower_bound(58, 58)
    assert precision_lower_bound(0, 10) == 0.0 and precision_lower_bound(0, 0) == 0.0


def test_a_threshold_is_recommended_only_where_its_bound_reaches_the_target() -> None:
    from icrlhf.generation.calibration import threshold_recommend

    rng = random.Random(8)
    confidences = [rng.random() for _ in range(2000)]
    # Right with probability 0.6 + 0.4 × confidence: 95% is reached only near the top.
    hits = [rng.random() < 0.6 + 0.4 * c for c in confidences]
    found = threshold_recommend(confidences, hits, 0.95, 30)
    assert found.threshold is not None and found.more_items_needed is None
    assert found.bound >= 0.95 and found.items >= 30
    above = [h for c, h in zip(confidences, hits, strict=True) if c >= found.threshold]
    assert (len(above), sum(above) / len(above)) == (found.items, found.precision)
    # The lowest such threshold: one item lower, the bound falls short.
    below = max(c for c in confidences if c < found.threshold)
    wider = [h for c, h in zip(confidences, hits, strict=True) if c >= below]
    from icrlhf.generation.calibration import precision_lower_bound

    assert precision_lower_bound(sum(wider), len(wider)) < 0.95

    # The same rate on a tenth of the items promises nothing yet, and says how far it is.
    few = threshold_recommend(confidences[:60], hits[:60], 0.95, 30)
    assert few.threshold is None and few.more_items_needed is not None
    assert few.more_items_needed > 0 and few.closest is not None
    shown = [h for c, h in zip(confidences[:60], hits[:60], strict=True) if c >= few.closest]
    assert len(shown) == few.items
    # A queue never that precise is told so, with no count to wait for.
    never = threshold_recommend(confidences, [c > 2 for c in confidences], 0.9, 30)
    assert never.threshold is None and never.more_items_needed is None


def test_validation_moves_forward_in_time(queue: Any) -> None:
    """Each block is judged by a fit on the decisions before it, never on later ones."""
    assert calibrations.forward_blocks(30) == [(5, 10), (10, 15), (15, 20), (20, 25), (25, 30)]
    rng = random.Random(9)
    for _ in range(120):
        decided(queue, rng, right_first=0.8)
    calibration = calibrations.calibration_fit(queue=queue)
    assert calibration is not None
    assert [r["target"] for r in calibration.recommendations] == list(
        calibrations.TARGET_PRECISIONS
    )
    for point in calibration.curve:
        if point["precision"] is not None:
            assert point["precision_low"] <= point["precision"]
    # Judged forward: the first of the six blocks has no fit before it, so the curve is
    # measured on the 100 later items only.
    assert max(point["items"] for point in calibration.curve) <= 100


def test_an_audit_stands_for_the_automated_items_no_reviewer_saw(queue: Any) -> None:
    """While automation runs, the confident region is seen through its audits alone: each
    weighs 1 / audit share in the refit."""
    from icrlhf.review.models import Automation

    queue.audit_percent = 20
    queue.save()
    rng = random.Random(10)
    for _ in range(3):
        decided(queue, rng, right_first=1.0)
    audited = calibrations.samples_of(queue)[1]
    item = Item.objects.get(pk=audited.item_id)
    generation = item.generations.get()
    Automation.objects.create(
        item=item,
        generation=generation,
        candidate=generation.candidates.order_by("position").first(),
        confidence=0.97,
        threshold=0.9,
        audit=True,
        final_text="voted answer",
    )
    weights = [sample.weight for sample in calibrations.samples_of(queue)]
    assert weights == [1.0, 5.0, 1.0]


def decided_bent(queue: Any, rng: random.Random) -> None:
    """An item whose first candidate's vote share says how often it is kept, along a bent
    curve no logistic one fits: a tenth below a vote of 0.6, 0.8 above it, nearly always from
    0.85 up."""
    item = ItemFactory(queue=queue, status="decided")
    generation = ready_generation(item, ["voted answer", "other answer"])
    Generation.objects.filter(pk=generation.pk).update(ranked_at=timezone.now())
    voted, other = generation.candidates.order_by("position")
    vote = rng.uniform(0.0, 1.0)
    voted.ranking_features = dict.fromkeys(FEATURES, 0.0) | {"vote": vote, "memory": 1.0}
    other.ranking_features = dict.fromkeys(FEATURES, 0.0)
    voted.save()
    other.save()
    kept = 0.1 if vote < 0.6 else 0.8 if vote < 0.85 else 0.99
    if rng.random() < kept:
        DecisionFactory(
            generation=generation,
            verdict="chosen",
            chosen_candidate=voted,
            final_text="voted answer",
        )
    else:
        DecisionFactory(generation=generation, verdict="none_acceptable")


def test_with_enough_items_a_bent_rate_gets_an_isotonic_confidence(queue: Any) -> None:
    """Platt's curve cannot bend with the data; from ISOTONIC_MIN_ITEMS scored items the
    isotonic map is tried forward and kept because it scores better there."""
    rng = random.Random(11)
    for _ in range(420):
        decided_bent(queue, rng)
    calibration = calibrations.calibration_fit(queue=queue)
    assert calibration is not None and calibration.isotonic
    knots = calibration.isotonic
    assert [k[0] for k in knots] == sorted(k[0] for k in knots)
    assert [k[1] for k in knots] == sorted(k[1] for k in knots)  # never less sure higher up
    assert knots[0][1] > 0.0 and knots[-1][1] < 1.0  # shrunk: no step promises certainty
    assert calibration.ece is not None and calibration.ece < 0.12  # forward, as above
    # What the stored map says of a first candidate, by the ranking's own score.
    from icrlhf.generation.ranking import confidence, score

    def at(vote: float) -> float:
        features = dict.fromkeys(FEATURES, 0.0) | {"vote": vote, "memory": 1.0}
        return confidence(score(features, calibration.coefficients), calibration)

    assert at(0.3) < 0.25 and 0.65 < at(0.75) < 0.9 and at(0.95) > 0.9


def test_memory_alone_gets_its_own_forward_confidence(queue: Any) -> None:
    """The gateway's answer from memory has no model answer beside it: it is fitted on the
    memory candidates only, by memory's features only, with its own curve and promises."""
    from icrlhf.generation.ranking import MEMORY_FEATURES

    rng = random.Random(13)
    for _ in range(calibrations.MIN_ITEMS - 1):
        decided(queue, rng, right_first=0.6)
    # Items whose candidates all came from the model say nothing about memory alone.
    plain = ItemFactory(queue=queue, status="decided")
    generation = ready_generation(plain, ["model answer"])
    Generation.objects.filter(pk=generation.pk).update(ranked_at=timezone.now())
    only = generation.candidates.get()
    only.ranking_features = dict.fromkeys(FEATURES, 0.0)
    only.save()
    DecisionFactory(generation=generation, verdict="chosen", chosen_candidate=only)
    calibration = calibrations.calibration_fit(queue=queue)
    assert calibration is not None and calibration.memory_fit is None  # 29 with memory

    for _ in range(170):
        decided(queue, rng, right_first=0.8)
    calibration = calibrations.calibration_fit(queue=queue)
    assert calibration is not None
    fit = calibration.memory_fit
    assert fit["features"] == list(MEMORY_FEATURES) and fit["items"] == 199
    assert len(fit["coefficients"]) == len(MEMORY_FEATURES) + 1
    assert fit["accepted_share"] == pytest.approx(0.78, abs=0.1)
    # Memory's features say nothing here (a vote drawn apart from the outcome): the
    # confidence is the base rate, and says so on the later items.
    at_half = next(p for p in fit["curve"] if p["threshold"] == 0.5)
    assert at_half["coverage"] > 0.9
    assert at_half["precision"] == pytest.approx(fit["accepted_share"], abs=0.05)
    assert fit["ece"] < 0.12
    assert [r["target"] for r in fit["recommendations"]] == list(calibrations.TARGET_PRECISIONS)
    assert max(point["items"] for point in fit["curve"]) <= 199 - 199 // 6
