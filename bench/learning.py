"""The learning-curve benchmark's parts that do not drive the product: the data split, the
simulated reviewer's comparison, statistics and the chart."""

import csv
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from icrlhf.generation import calibration
from icrlhf.generation.calibration import expected_calibration_error
from icrlhf.insights.charts import Series, line_chart
from icrlhf.insights.stats import two_proportion_p, wilson
from icrlhf.kinds.labels import label_named, label_words


@dataclass(frozen=True)
class Labelled:
    text: str
    label: str


def labelled_split(
    path: Path, *, seed: int, test: int, stream: int
) -> tuple[list[Labelled], list[Labelled]]:
    """A fixed, seeded split of a data set in Banking77's layout (a CSV with `text` and
    `category` columns): held-out messages, and the stream of decisions to learn from."""
    with path.open(newline="", encoding="utf-8") as handle:
        rows = [Labelled(r["text"].strip(), r["category"].strip()) for r in csv.DictReader(handle)]
    if len(rows) < test + stream:
        raise ValueError(
            f"it has {len(rows)} messages; {test} held out and {stream} to learn from "
            f"need {test + stream}."
        )
    random.Random(seed).shuffle(rows)
    return rows[:test], rows[test : test + stream]


def label_of(answer: str, labels: list[str]) -> str:
    """The label a free-text answer names, as the product reads it for an intent queue."""
    return label_named(answer, labels)


def rating_of(named: str, gold: str) -> int:
    """The simulated reviewer's 1…5 rating of an answer naming `named` when `gold` is right:
    5 right, 3 a near miss (the labels share a word: card_arrival for card_delivery_estimate
    does not, card_linking for card_arrival does), 1 otherwise."""
    if named == gold:
        return 5
    return 3 if named and labels_share_a_word(named, gold) else 1


# (key, name, colour): every rate the benchmark measures at each number of stored decisions.
SERIES = (
    ("acceptance", "best-of-N acceptance", "#1d7a3a"),
    ("first_accuracy", "first candidate", "#0b5cad"),
    ("knn_top1", "kNN top-1 label", "#8a5a00"),
    ("llm_with_examples", "LLM, retrieved examples", "#7b3fa0"),
    ("random_examples", "LLM, random examples", "#b3261e"),
    ("no_retrieval", "LLM, no retrieval", "#5b6672"),
)
# Steps of the curve that must be significant, and for which rates.
SIGNIFICANT_RATES = ("acceptance", "first_accuracy")

Counts = dict[str, tuple[int, int]]  # rate key → (hits, total)


def summarise(counts: Counts) -> dict[str, Any]:
    """Each rate with its 95% Wilson interval and its sample size; None where nothing was
    measured (the kNN baseline with an empty memory, say)."""
    row: dict[str, Any] = {}
    for key, (hits, total) in counts.items():
        row[key] = hits / total if total else None
        row[f"{key}_ci"] = list(wilson(hits, total)) if total else None
        row[f"{key}_n"] = total
    return row


def significance(counts_by_size: dict[int, Counts]) -> dict[str, dict[str, float]]:
    """p-values of each step between consecutive sizes, e.g. {"0→50": {"acceptance": …}}."""
    sizes = sorted(counts_by_size)
    return {
        f"{before}→{after}": {
            key: two_proportion_p(*counts_by_size[before][key], *counts_by_size[after][key])
            for key in SIGNIFICANT_RATES
        }
        for before, after in zip(sizes, sizes[1:], strict=False)
    }


THRESHOLDS = (0.8, 0.9, 0.95)
CURVE_THRESHOLDS = tuple(round(0.5 + 0.05 * step, 2) for step in range(10)) + (0.99,)
TARGET_PRECISION = 0.95


def confidence_summary(
    confidences: list[float], right: list[bool], history_curve: list[dict[str, Any]]
) -> dict[str, Any]:
    """How far the first candidate's confidence can be trusted: its reliability table, the
    expected calibration error, precision and coverage at a few thresholds, the share of
    items that could be automated at 95% precision (the threshold chosen on these items,
    which flatters it), and what the threshold a curator would pick from the queue's own
    curve (`history_curve`: the lowest with 95% precision there) gives on these items."""
    if not confidences:
        return {"calibrated_n": 0}
    coverage, threshold = coverage_at_precision(confidences, right, TARGET_PRECISION)
    picked = next(
        (
            p["threshold"]
            for p in history_curve
            if p["precision"] is not None and p["precision"] >= TARGET_PRECISION
        ),
        None,
    )
    at_picked = (
        asdict(calibration.precision_coverage(confidences, right, [picked])[0])
        if picked is not None
        else None
    )
    return {
        "calibrated_n": len(confidences),
        "ece": calibration.expected_calibration_error(confidences, right),
        "ece_ci": list(ece_interval(confidences, right)),
        "reliability": [asdict(b) for b in calibration.reliability(confidences, right)],
        "thresholds": [
            asdict(p) for p in calibration.precision_coverage(confidences, right, THRESHOLDS)
        ],
        "coverage_at_95_precision": coverage,
        "threshold_at_95_precision": threshold,
        "at_history_threshold": at_picked,
        "curve": [
            asdict(p) for p in calibration.precision_coverage(confidences, right, CURVE_THRESHOLDS)
        ],
    }


def confidence_curve_svg(size: int, row: dict[str, Any]) -> str:
    """Precision and coverage of the first candidate against the confidence threshold."""
    curve = row["curve"]
    return line_chart(
        title=f"Automating the first candidate at {size} stored decisions (held out)",
        x_labels=[f"{p['threshold']:.2f}" for p in curve],
        x_title="confidence threshold",
        series=[
            Series("precision", "#1d7a3a", [p["precision"] for p in curve]),
            Series("coverage", "#0b5cad", [p["coverage"] for p in curve]),
        ],
    )


def curve_svg(sizes: list[int], results: dict[str, dict[str, Any]]) -> str:
    return line_chart(
        title="Learning curve (95% intervals)",
        x_labels=[str(size) for size in sizes],
        x_title="stored decisions",
        series=[
            Series(
                name,
                colour,
                [results[str(size)].get(key) for size in sizes],
                [results[str(size)].get(f"{key}_ci") for size in sizes],
            )
            for key, name, colour in SERIES
        ],
    )


# Requests no Banking77 example answers, as a general queue receives beside its own traffic:
# memory should reach none of them (examples in the prompt, or a stored answer offered).
OFF_TOPIC = (
    "Write a haiku about autumn leaves.",
    "What is the boiling point of water on a high mountain?",
    "Translate 'good morning' into Italian.",
    "How do I reverse a list in Python?",
    "Recommend a science fiction novel for a long flight.",
    "What can I use instead of eggs in pancakes?",
    "Explain how photosynthesis works in simple terms.",
    "Who painted the ceiling of the Sistine Chapel?",
    "How many players are on a football team?",
    "Give me a short stretching routine for the morning.",
    "What is the capital of Australia?",
    "Suggest a name for a grey kitten.",
    "How long should I boil an egg for a soft yolk?",
    "Summarise the plot of Hamlet in two sentences.",
    "What causes the northern lights?",
    "How do I get red wine out of a carpet?",
    "Which planets can be seen without a telescope?",
    "Write a limerick about a cat who loves jazz.",
    "How do I tune a guitar to drop D?",
    "What is the difference between a virus and a bacterium?",
    "Plan a three-day trip to Lisbon.",
    "How often should I water a cactus?",
    "What is the time complexity of binary search?",
    "Convert 30 degrees Celsius to Fahrenheit.",
)

# What a minimum similarity must not cost, and how much of it may go (a fraction: 0.02 is 2
# points, 3 of 150 held-out messages, about what the model's sampling moves between runs).
MINIMUM_RATES = ("first_accuracy", "acceptance")
MINIMUM_TOLERANCE = 0.02


def minimum_choose(
    sweep: dict[str, list[dict[str, Any]]], *, tolerance: float = MINIMUM_TOLERANCE
) -> float:
    """The default minimum similarity from a sweep ({size: [row per minimum]}): the highest
    minimum that costs nothing measurable. A minimum's shortfall is the most its
    first-candidate accuracy or best-of-N acceptance trails the best minimum's, over the swept
    sizes; it passes within `tolerance`. The choice is the top of the first run of passing
    minimums from the lowest (one lucky high value beyond a failing one is not taken); when
    none passes, the one that falls shortest."""
    minimums = sorted({row["minimum"] for rows in sweep.values() for row in rows})
    if not minimums:
        raise ValueError("An empty sweep chooses nothing.")
    best = {
        size: {key: max(row[key] or 0.0 for row in rows) for key in MINIMUM_RATES}
        for size, rows in sweep.items()
    }

    def shortfall(minimum: float) -> float:
        return max(
            best[size][key] - (row[key] or 0.0)
            for size, rows in sweep.items()
            for row in rows
            if row["minimum"] == minimum
            for key in MINIMUM_RATES
        )

    chosen: float | None = None
    for minimum in minimums:
        if shortfall(minimum) <= tolerance + 1e-9:
            chosen = minimum
        elif chosen is not None:
            break
    if chosen is None:
        # Ties go to the higher minimum: it keeps more unrelated examples out.
        chosen = min(reversed(minimums), key=shortfall)
    return chosen


def labels_share_a_word(one: str, other: str) -> bool:
    return bool(set(label_words(one)) & set(label_words(other)))


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


def ece_interval(
    confidences: Sequence[float], hits: Sequence[bool], *, resamples: int = 1000, seed: int = 0
) -> tuple[float, float]:
    """A 95% bootstrap interval on the expected calibration error (items resampled with
    replacement): whether an ECE of 0.05 can be told apart from one of 0.08 on these items."""
    if not confidences:
        return 0.0, 0.0
    rng = np.random.default_rng(seed)
    c, h = np.asarray(confidences), np.asarray(hits, dtype=bool)
    values = [
        expected_calibration_error(list(c[draw]), list(h[draw]))
        for draw in rng.integers(0, len(c), size=(resamples, len(c)))
    ]
    low, high = np.percentile(values, [2.5, 97.5])
    return float(low), float(high)
