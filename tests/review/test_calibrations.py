"""Fitting a queue's calibration on its decided items."""

import random
from typing import Any

import pytest
from django.utils import timezone

from icrlhf.generation.models import Calibration, Generation
from icrlhf.generation.ranking import FEATURES, PRIOR_COEFFICIENTS
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
    assert calibration.ece is not None and calibration.ece < 0.1
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
    monkeypatch.setattr(calibrations, "_fit", lambda samples: backwards)
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
