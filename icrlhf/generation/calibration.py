"""The arithmetic of calibrated confidence: fitting the ranking's logistic model, and judging
a confidence against what reviewers then did (reliability, ECE, precision and coverage).
Pure functions: the review app gathers the decided items, the benchmark its own."""

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.optimize import isotonic_regression
from scipy.stats import beta, norm

# An L2 penalty keeps the fit finite when a feature separates the answers perfectly (a queue
# whose memory answers were always accepted, say).
_L2 = 1.0
_NEWTON_STEPS = 50


def logistic_fit(
    rows: Sequence[Sequence[float]],
    accepted: Sequence[bool],
    weights: Sequence[float] | None = None,
) -> list[float]:
    """Coefficients (intercept first) of a logistic regression, by Newton's method; each row
    counted `weights` times (default once)."""
    x = np.column_stack([np.ones(len(rows)), np.asarray(rows, dtype=float)])
    y = np.asarray(accepted, dtype=float)
    counted = np.ones(len(rows)) if weights is None else np.asarray(weights, dtype=float)
    penalty = _L2 * np.eye(x.shape[1])
    penalty[0, 0] = 0.0  # the intercept is not shrunk
    w = np.zeros(x.shape[1])
    for _ in range(_NEWTON_STEPS):
        p = 1.0 / (1.0 + np.exp(-np.clip(x @ w, -40, 40)))
        gradient = x.T @ (counted * (p - y)) + penalty @ w
        hessian = (x.T * (counted * p * (1 - p))) @ x + penalty
        step = np.linalg.solve(hessian + 1e-9 * np.eye(x.shape[1]), gradient)
        w -= step
        if float(np.abs(step).max()) < 1e-8:
            break
    return [float(v) for v in w]


def _sigmoid(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-max(-40.0, min(40.0, z))))


def platt_fit(
    scores: Sequence[float], hits: Sequence[bool], weights: Sequence[float]
) -> list[float]:
    """A logistic regression of acceptance on the score (each weighted as its item), with one
    accepted and one rejected pseudo-item at the median score, so that a sample where every
    one was accepted (or none was) gives a confidence short of certainty."""
    median = sorted(scores)[len(scores) // 2]
    rows = [[value] for value in scores] + [[median], [median]]
    return logistic_fit(rows, [*hits, True, False], [*weights, 1, 1])


# Each isotonic step's rate is shrunk by this many pseudo-items toward the whole sample's:
# a step of three items all accepted is not a promise of 100%.
_ISOTONIC_PRIOR_ITEMS = 2.0


def isotonic_fit(
    scores: Sequence[float], hits: Sequence[bool], weights: Sequence[float]
) -> list[list[float]]:
    """A non-decreasing map from score to acceptance rate (pool-adjacent-violators, weighted):
    knots [score, rate], one per step at its weighted mean score, read by linear
    interpolation. Unlike Platt's two parameters it assumes no shape, so it stays calibrated
    when the rate bends, which a fuller memory makes it do; it needs a few hundred items.
    Items tied on a score are pooled first: their order says nothing."""
    x = np.asarray(scores, dtype=float)
    w = np.asarray(weights, dtype=float)
    values, at = np.unique(x, return_inverse=True)
    mass = np.bincount(at, weights=w)
    rates = np.bincount(at, weights=w * np.asarray(hits, dtype=float)) / mass
    steps = isotonic_regression(rates, weights=mass, increasing=True)
    overall = float(np.average(rates, weights=mass))
    knots: list[list[float]] = []
    for start, end in zip(steps.blocks[:-1], steps.blocks[1:], strict=True):
        step_mass = float(mass[start:end].sum())
        rate = (float(steps.x[start]) * step_mass + overall * _ISOTONIC_PRIOR_ITEMS) / (
            step_mass + _ISOTONIC_PRIOR_ITEMS
        )
        centre = float(np.average(values[start:end], weights=mass[start:end]))
        # Shrinking can undo the order between steps of different sizes: keep it.
        knots.append([centre, max(rate, knots[-1][1]) if knots else rate])
    return knots


@dataclass(frozen=True)
class ConfidenceMap:
    """A score → probability map: Platt's two coefficients, or isotonic knots when set."""

    platt: Sequence[float]
    isotonic: Sequence[Sequence[float]] | None = None

    def __call__(self, value: float) -> float:
        if self.isotonic:
            xs = [knot[0] for knot in self.isotonic]
            ys = [knot[1] for knot in self.isotonic]
            return float(np.interp(value, xs, ys))
        return _sigmoid(self.platt[0] + self.platt[1] * value)


def brier(confidences: Sequence[float], hits: Sequence[bool]) -> float:
    """The mean squared gap between each confidence and what happened (lower is better): a
    proper score, so it rewards a confidence that is both calibrated and sharp."""
    if not confidences:
        return 0.0
    return float(np.mean((np.asarray(confidences) - np.asarray(hits, dtype=float)) ** 2))


@dataclass(frozen=True)
class Bin:
    low: float
    high: float
    count: int
    confidence: float  # mean confidence in the bin
    accepted: float  # observed share accepted


def reliability(confidences: Sequence[float], hits: Sequence[bool], bins: int = 10) -> list[Bin]:
    """Equal-width confidence bins, with the mean confidence and the observed rate in each."""
    table = []
    for index in range(bins):
        low, high = index / bins, (index + 1) / bins
        inside = [
            (c, h)
            for c, h in zip(confidences, hits, strict=True)
            if low <= c < high or (index == bins - 1 and c == 1.0)
        ]
        if inside:
            table.append(
                Bin(
                    low,
                    high,
                    len(inside),
                    sum(c for c, _ in inside) / len(inside),
                    sum(h for _, h in inside) / len(inside),
                )
            )
    return table


def expected_calibration_error(confidences: Sequence[float], hits: Sequence[bool]) -> float:
    """The bins' gaps between confidence and observed rate, weighted by their counts."""
    table = reliability(confidences, hits)
    total = sum(b.count for b in table)
    return sum(b.count * abs(b.confidence - b.accepted) for b in table) / total if total else 0.0


@dataclass(frozen=True)
class Point:
    threshold: float
    precision: float | None  # None: nothing reaches this threshold
    coverage: float
    items: int
    precision_low: float = 0.0  # its one-sided lower confidence bound (GUARANTEE_LEVEL)


def precision_coverage(
    confidences: Sequence[float], hits: Sequence[bool], thresholds: Sequence[float]
) -> list[Point]:
    """At each threshold: the share of items at or above it (coverage) and how many of those
    were right (precision)."""
    points = []
    for threshold in thresholds:
        above = [h for c, h in zip(confidences, hits, strict=True) if c >= threshold]
        points.append(
            Point(
                threshold=threshold,
                precision=sum(above) / len(above) if above else None,
                coverage=len(above) / len(confidences) if confidences else 0.0,
                items=len(above),
                precision_low=precision_lower_bound(sum(above), len(above)),
            )
        )
    return points


# A precision promised to a curator is promised with this confidence (one-sided).
GUARANTEE_LEVEL = 0.95


def precision_lower_bound(right: int, items: int, level: float = GUARANTEE_LEVEL) -> float:
    """The one-sided Clopper–Pearson lower bound on a precision of `right` of `items`: the
    lowest true precision under which seeing this many right or more has a chance of at least
    1 − level. Exact (it never promises more than the data show, however few the items),
    where the Wilson bound can overshoot near 100% with few items."""
    return float(_lower_bounds(np.array([right]), np.array([items]), level)[0])


def precision_upper_bound(right: int, items: int, level: float = GUARANTEE_LEVEL) -> float:
    """The one-sided Clopper–Pearson upper bound: the most the precision can be (1.0 with
    no items)."""
    return 1.0 - precision_lower_bound(items - right, items, level)


def _lower_bounds(
    right: np.ndarray[Any, Any], items: np.ndarray[Any, Any], level: float
) -> np.ndarray[Any, Any]:
    # The beta quantile is the binomial tail inverted; nothing right promises nothing.
    safe = np.maximum(right, 1)
    bounds = beta.ppf(1.0 - level, safe, np.maximum(items - safe + 1, 1))
    return np.where((right > 0) & (items > 0), bounds, 0.0)


@dataclass(frozen=True)
class Recommendation:
    """The threshold a curator can set for a target precision, with its evidence; or, when
    none can be promised yet, how many more items above a threshold would do it."""

    target: float
    threshold: float | None  # None: nothing can be promised yet
    items: int  # items at or above it (at the most promising threshold when None)
    precision: float | None
    bound: float  # the lower confidence bound on that precision
    more_items_needed: int | None  # None with a threshold; also when no rate reaches the target
    # Without a recommendation: the most convincing threshold so far, the one `items`,
    # `precision` and `bound` describe.
    closest: float | None = None


def threshold_recommend(
    confidences: Sequence[float], hits: Sequence[bool], target: float, min_items: int
) -> Recommendation:
    """The lowest threshold at which the lower confidence bound on precision reaches `target`
    with at least `min_items` items at or above it. Every confidence seen is a cut (items tied
    at one confidence are taken together). The bound holds for a threshold fixed in advance;
    chosen among many on the same items it is a little optimistic, which is why the audits
    watch automation online (guard.py). With none, the most convincing cut whose precision is
    above the target, and about how many more items above it would do."""
    ranked = sorted(zip(confidences, hits, strict=True), key=lambda pair: -pair[0])
    if not ranked:
        return Recommendation(target, None, 0, None, 0.0, None)
    values = np.array([c for c, _ in ranked])
    right = np.cumsum([h for _, h in ranked])
    items = np.arange(1, len(ranked) + 1)
    # A threshold stops only after the last item of its value.
    ends = np.flatnonzero(np.append(values[1:] < values[:-1], True))
    right, items, values = right[ends], items[ends], values[ends]
    below = np.append(values[1:], -np.inf)  # the next cut's value, under each cut
    bounds = _lower_bounds(right, items, GUARANTEE_LEVEL)
    kept = np.flatnonzero((items >= min_items) & (bounds >= target))
    passed = int(kept[-1]) if kept.size else None  # the lowest threshold: the most items
    if passed is not None:
        return Recommendation(
            target,
            _round_threshold(float(values[passed]), float(below[passed])),
            int(items[passed]),
            float(right[passed] / items[passed]),
            float(bounds[passed]),
            None,
        )
    above = np.flatnonzero(right / items > target)
    if not above.size:
        at = int(np.argmax(bounds))
        return Recommendation(
            target, None, int(items[at]), float(right[at] / items[at]), float(bounds[at]), None
        )
    at = int(above[np.argmax(bounds[above])])
    rate = float(right[at] / items[at])
    return Recommendation(
        target,
        None,
        int(items[at]),
        rate,
        float(bounds[at]),
        _more_items_needed(rate, int(items[at]), target, min_items),
        closest=float(values[at]),
    )


def _round_threshold(value: float, next_below: float) -> float:
    """A threshold a curator can type that takes exactly the same items: the roundest number
    in (next_below, value] (a cut's value when no round one fits)."""
    for decimals in (2, 3, 4):
        rounded = math.floor(value * 10**decimals) / 10**decimals
        if rounded > next_below:
            return rounded
    return value


def _more_items_needed(rate: float, items: int, target: float, min_items: int) -> int:
    """About how many more items above the threshold, right at the observed rate, would
    bring the lower bound to the target: the normal approximation, and never fewer than all
    right would need (rate^n = 1 − level) or than `min_items`."""
    z = float(norm.ppf(GUARANTEE_LEVEL))
    approximate = z * z * rate * (1 - rate) / (rate - target) ** 2
    all_right = math.log(1 - GUARANTEE_LEVEL) / math.log(target)
    return max(0, math.ceil(max(approximate, all_right, min_items)) - items)
