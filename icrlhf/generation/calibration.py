"""The arithmetic of calibrated confidence: fitting the ranking's logistic model, and judging
a confidence against what reviewers then did (reliability, ECE, precision and coverage).
Pure functions: the review app gathers the decided items, the benchmark its own."""

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# An L2 penalty keeps the fit finite when a feature separates the answers perfectly (a queue
# whose memory answers were always accepted, say).
_L2 = 1.0
_NEWTON_STEPS = 50


def logistic_fit(rows: Sequence[Sequence[float]], accepted: Sequence[bool]) -> list[float]:
    """Coefficients (intercept first) of a logistic regression, by Newton's method."""
    x = np.column_stack([np.ones(len(rows)), np.asarray(rows, dtype=float)])
    y = np.asarray(accepted, dtype=float)
    penalty = _L2 * np.eye(x.shape[1])
    penalty[0, 0] = 0.0  # the intercept is not shrunk
    w = np.zeros(x.shape[1])
    for _ in range(_NEWTON_STEPS):
        p = 1.0 / (1.0 + np.exp(-np.clip(x @ w, -40, 40)))
        gradient = x.T @ (p - y) + penalty @ w
        hessian = (x.T * (p * (1 - p))) @ x + penalty
        step = np.linalg.solve(hessian + 1e-9 * np.eye(x.shape[1]), gradient)
        w -= step
        if float(np.abs(step).max()) < 1e-8:
            break
    return [float(v) for v in w]


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
            )
        )
    return points


def coverage_at_precision(
    confidences: Sequence[float], hits: Sequence[bool], precision: float
) -> tuple[float, float | None]:
    """The largest share of items that can be automated at this precision, taking the most
    confident first, and the threshold that does it (None: not even the first one)."""
    ranked = sorted(zip(confidences, hits, strict=True), key=lambda pair: -pair[0])
    best, threshold, right = 0.0, None, 0
    for count, (confidence, hit) in enumerate(ranked, start=1):
        right += hit
        # Only where the next item is less confident can a threshold stop here.
        last_of_its_value = count == len(ranked) or ranked[count][0] < confidence
        if last_of_its_value and right / count >= precision:
            best, threshold = count / len(ranked), confidence
    return best, threshold
