"""The learning-curve benchmark's parts that do not drive the product: the data split, the
simulated reviewer's comparison, statistics and the chart."""

import csv
import random
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from icrlhf.generation import calibration
from icrlhf.insights.charts import Series, line_chart
from icrlhf.insights.stats import two_proportion_p, wilson


@dataclass(frozen=True)
class Labelled:
    text: str
    label: str


def banking77_split(
    path: Path, *, seed: int, test: int, stream: int
) -> tuple[list[Labelled], list[Labelled]]:
    """A fixed, seeded split: held-out messages, and the stream of decisions to learn from."""
    with path.open(newline="", encoding="utf-8") as handle:
        rows = [Labelled(r["text"].strip(), r["category"].strip()) for r in csv.DictReader(handle)]
    random.Random(seed).shuffle(rows)
    return rows[:test], rows[test : test + stream]


def _words(text: str) -> list[str]:
    return re.sub(r"[^a-z0-9_ ]+", " ", text.lower().replace("-", "_")).split()


def label_of(answer: str, labels: list[str]) -> str:
    """The label a free-text answer names on its first line, compared case- and
    punctuation-blind (Banking77 has `Refund_not_showing_up` and `reverted_card_payment?`);
    failing that, the first word of that line that is a label; "" when none."""
    by_form = {"_".join(_words(label)): label for label in labels}
    words = _words((answer.strip().splitlines() or [""])[0])
    if "_".join(words) in by_form:
        return by_form["_".join(words)]
    return next((by_form[word] for word in words if word in by_form), "")


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
    coverage, threshold = calibration.coverage_at_precision(confidences, right, TARGET_PRECISION)
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
