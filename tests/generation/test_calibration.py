"""The arithmetic of calibrated confidence, on data whose answer is known."""

import math
import random

import pytest

from icrlhf.generation.calibration import (
    ConfidenceMap,
    brier,
    expected_calibration_error,
    isotonic_fit,
    logistic_fit,
    platt_fit,
    precision_coverage,
    reliability,
)


def test_the_logistic_fit_recovers_the_coefficients_that_generated_the_data() -> None:
    rng = random.Random(3)
    rows, accepted = [], []
    for _ in range(4000):
        x = [rng.uniform(-2, 2), rng.uniform(-2, 2)]
        p = 1 / (1 + math.exp(-(-0.5 + 2.0 * x[0] - 1.0 * x[1])))
        rows.append(x)
        accepted.append(rng.random() < p)
    intercept, a, b = logistic_fit(rows, accepted)
    assert intercept == pytest.approx(-0.5, abs=0.2)
    assert a == pytest.approx(2.0, abs=0.25)
    assert b == pytest.approx(-1.0, abs=0.2)


def test_a_feature_that_separates_perfectly_still_gets_finite_coefficients() -> None:
    rows = [[0.0]] * 20 + [[1.0]] * 20
    coefficients = logistic_fit(rows, [False] * 20 + [True] * 20)
    assert all(math.isfinite(c) for c in coefficients)
    assert coefficients[1] > 2


def test_a_weighted_row_counts_as_that_many_copies_of_it() -> None:
    rng = random.Random(4)
    rows = [[rng.uniform(-2, 2)] for _ in range(60)]
    accepted = [rng.random() < 1 / (1 + math.exp(-2 * row[0])) for row in rows]
    weights = [3.0 if i % 4 == 0 else 1.0 for i in range(60)]
    copied = [
        (r, a) for r, a, w in zip(rows, accepted, weights, strict=True) for _ in range(int(w))
    ]
    assert logistic_fit(rows, accepted, weights) == pytest.approx(
        logistic_fit([r for r, _ in copied], [a for _, a in copied]), abs=1e-6
    )


def test_reliability_bins_compare_the_mean_confidence_with_what_happened() -> None:
    table = reliability([0.95, 0.9, 0.92, 0.15, 1.0], [True, True, False, False, True])
    assert [(b.low, b.count) for b in table] == [(0.1, 1), (0.9, 4)]
    top = table[1]
    assert top.confidence == pytest.approx((0.95 + 0.9 + 0.92 + 1.0) / 4)
    assert top.accepted == pytest.approx(0.75)


def test_the_calibration_error_is_zero_when_confidence_matches_and_large_when_not() -> None:
    honest = [0.75] * 4
    assert expected_calibration_error(honest, [True, True, True, False]) == pytest.approx(0.0)
    assert expected_calibration_error([0.95] * 4, [False] * 4) == pytest.approx(0.95)


def test_precision_and_coverage_at_each_threshold() -> None:
    confidences = [0.99, 0.95, 0.9, 0.85, 0.5]
    hits = [True, True, False, True, False]
    at_90, at_999 = precision_coverage(confidences, hits, [0.9, 0.999])
    assert (at_90.precision, at_90.coverage, at_90.items) == (pytest.approx(2 / 3), 0.6, 3)
    assert (at_999.precision, at_999.coverage) == (None, 0.0)


def _bent_sample(rng: random.Random, count: int) -> tuple[list[float], list[bool]]:
    """Scores whose acceptance rate is a step no logistic curve follows: 5% below 0, 60%
    between 0 and 2, 97% above."""
    scores = [rng.uniform(-4, 4) for _ in range(count)]
    rate = [0.05 if x < 0 else 0.6 if x < 2 else 0.97 for x in scores]
    return scores, [rng.random() < p for p in rate]


def test_the_isotonic_map_follows_a_bent_rate_where_platts_curve_cannot() -> None:
    rng = random.Random(21)
    scores, hits = _bent_sample(rng, 1500)
    weights = [1.0] * len(scores)
    knots = isotonic_fit(scores, hits, weights)
    assert [k[0] for k in knots] == sorted(k[0] for k in knots)
    assert [k[1] for k in knots] == sorted(k[1] for k in knots)
    bent = ConfidenceMap(platt_fit(scores, hits, weights), knots)
    platt = ConfidenceMap(platt_fit(scores, hits, weights))
    later, later_hits = _bent_sample(random.Random(22), 3000)
    as_bent = [bent(x) for x in later]
    as_platt = [platt(x) for x in later]
    assert expected_calibration_error(as_bent, later_hits) < 0.03
    assert brier(as_bent, later_hits) < brier(as_platt, later_hits)
    assert bent(1.0) == pytest.approx(0.6, abs=0.08)
    assert bent(-100) == knots[0][1] and bent(100) == knots[-1][1]  # flat beyond the data


def test_a_short_all_accepted_step_is_not_promised_as_certain() -> None:
    knots = isotonic_fit([0.0, 1.0, 2.0, 3.0], [False, False, True, True], [1.0] * 4)
    assert knots[-1][1] < 1.0 and knots[0][1] > 0.0


def test_items_tied_on_a_score_are_one_step_whatever_their_order() -> None:
    knots = isotonic_fit([0.0, 0.0, 2.0, 2.0], [False, True, False, True], [1.0] * 4)
    assert len(knots) == 1 and knots[0][1] == pytest.approx(0.5)
    assert (
        len(
            {k[0] for k in isotonic_fit([1.0, 1.0, 1.0, 3.0], [True, False, True, True], [1.0] * 4)}
        )
        == 2
    )
