"""The learning benchmark's pure parts: the split, the simulated reviewer's reading of an
answer, and the statistics (no services)."""

import random
from pathlib import Path

import pytest
from django.conf import settings

from bench.learning import (
    coverage_at_precision,
    ece_interval,
    label_of,
    labelled_split,
    minimum_choose,
    significance,
    summarise,
    two_proportion_p,
    wilson,
)
from icrlhf.generation.calibration import expected_calibration_error

LABELS = ["card_arrival", "Refund_not_showing_up", "reverted_card_payment?", "pin_blocked"]


@pytest.mark.parametrize(
    ("answer", "label"),
    [
        ("card_arrival", "card_arrival"),
        ("  Card arrival\nYour card is on its way.", "card_arrival"),
        ("card-arrival.", "card_arrival"),
        ("refund_not_showing_up", "Refund_not_showing_up"),
        ("Reverted card payment", "reverted_card_payment?"),
        ("The intent is pin_blocked.", "pin_blocked"),
        ("card arrival is late", ""),  # neither the whole line nor one word is a label
        ("Some chatter\ncard_arrival", ""),  # only the first line counts
        ("", ""),
    ],
)
def test_an_answer_names_a_label_on_its_first_line(answer: str, label: str) -> None:
    assert label_of(answer, LABELS) == label


def test_the_split_is_fixed_by_its_seed_and_disjoint() -> None:
    path: Path = settings.SHARED_DATA_DIR / "banking77" / "test.csv"
    held_out, stream = labelled_split(path, seed=7, test=150, stream=600)
    again, _ = labelled_split(path, seed=7, test=150, stream=600)
    other, _ = labelled_split(path, seed=8, test=150, stream=600)
    assert (len(held_out), len(stream)) == (150, 600)
    assert held_out == again and held_out != other
    assert not {r.text for r in held_out} & {r.text for r in stream}


def test_wilson_interval_brackets_the_rate_and_narrows_with_more_data() -> None:
    low, high = wilson(45, 150)
    assert low < 0.3 < high
    wide = wilson(9, 30)
    assert wide[1] - wide[0] > high - low
    assert wilson(0, 150)[0] == 0.0 and wilson(150, 150)[1] == pytest.approx(1.0)


def test_two_proportions_differ_significantly_only_when_they_do() -> None:
    assert two_proportion_p(30, 150, 60, 150) < 0.001
    assert two_proportion_p(30, 150, 33, 150) > 0.5
    assert two_proportion_p(0, 0, 1, 10) == 1.0


def test_summary_and_significance_per_step() -> None:
    counts = {
        0: {"acceptance": (0, 150), "first_accuracy": (0, 150), "knn_top1": (0, 0)},
        50: {"acceptance": (60, 150), "first_accuracy": (50, 150), "knn_top1": (50, 150)},
    }
    row = summarise(counts[0])
    assert row["acceptance"] == 0.0 and row["acceptance_n"] == 150
    assert row["knn_top1"] is None and row["knn_top1_ci"] is None  # nothing to measure
    steps = significance(counts)
    assert list(steps) == ["0→50"]
    assert steps["0→50"]["acceptance"] < 1e-6 and steps["0→50"]["first_accuracy"] < 1e-6


def swept(*rows: tuple[float, float, float]) -> list[dict[str, float]]:
    return [{"minimum": m, "first_accuracy": f, "acceptance": a} for m, f, a in rows]


def test_the_chosen_minimum_is_the_highest_that_costs_no_accuracy_at_any_size() -> None:
    sweep = {
        "50": swept((-1, 0.40, 0.50), (0.3, 0.41, 0.49), (0.4, 0.39, 0.48), (0.5, 0.30, 0.40)),
        "600": swept((-1, 0.80, 0.90), (0.3, 0.80, 0.90), (0.4, 0.80, 0.89), (0.5, 0.80, 0.90)),
    }
    assert minimum_choose(sweep, tolerance=0.02) == 0.4  # 0.5 costs 11 points at 50
    assert minimum_choose(sweep, tolerance=0.015) == 0.3  # 0.4 trails by 2 at 50
    assert minimum_choose({"50": sweep["50"][:1]}, tolerance=0.02) == -1


def test_a_lucky_high_minimum_beyond_a_costly_one_is_not_chosen() -> None:
    sweep = {"50": swept((-1, 0.5, 0.6), (0.3, 0.5, 0.6), (0.4, 0.3, 0.6), (0.5, 0.5, 0.6))}
    assert minimum_choose(sweep, tolerance=0.02) == 0.3


def test_a_minimum_that_helps_is_chosen_over_none() -> None:
    """Unrelated examples can mislead: where no minimum is worse, the run starts higher."""
    sweep = {"50": swept((-1, 0.30, 0.40), (0.3, 0.45, 0.50), (0.4, 0.44, 0.50), (0.5, 0.2, 0.3))}
    assert minimum_choose(sweep, tolerance=0.02) == 0.4
    # Nothing within the tolerance at every size: the one that falls shortest.
    split = {
        "50": swept((-1, 0.5, 0.5), (0.4, 0.3, 0.3)),  # 0.4 trails by 20 points here
        "600": swept((-1, 0.2, 0.2), (0.4, 0.45, 0.45)),  # none by 25 here
    }
    assert minimum_choose(split, tolerance=0.02) == 0.4


def test_a_data_set_not_in_banking77s_layout_is_refused_with_a_sentence(tmp_path: Path) -> None:
    from django.core.management import call_command
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="Banking77's layout"):
        call_command("bench_learning", f"--dataset={tmp_path}")
    (tmp_path / "categories.json").write_text('["a", "b"]')
    (tmp_path / "test.csv").write_text("text,category\nhello,a\nbye,b\n")
    with pytest.raises(CommandError, match="it has 2 messages"):
        call_command("bench_learning", f"--dataset={tmp_path}", "--test=10", "--sizes=0,5")


def test_coverage_at_a_precision_takes_the_most_confident_first() -> None:
    confidences = [0.99, 0.95, 0.9, 0.85, 0.5]
    hits = [True, True, False, True, False]
    assert coverage_at_precision(confidences, hits, 1.0) == (0.4, 0.95)
    assert coverage_at_precision(confidences, hits, 0.75) == (0.8, 0.85)
    assert coverage_at_precision([0.9, 0.8], [False, True], 0.95) == (0.0, None)


def test_tied_confidences_are_automated_together_or_not_at_all() -> None:
    # A threshold cannot take one of two items at 0.9 and leave the other.
    assert coverage_at_precision([0.9, 0.9, 0.5], [True, False, True], 1.0) == (0.0, None)


def test_the_ece_interval_holds_the_ece_and_narrows_with_more_items() -> None:
    rng = random.Random(23)
    confidences = [rng.uniform(0.5, 1.0) for _ in range(2400)]
    hits = [rng.random() < c for c in confidences]
    few = ece_interval(confidences[:150], hits[:150])
    many = ece_interval(confidences, hits)
    assert few[0] <= expected_calibration_error(confidences[:150], hits[:150]) <= few[1]
    assert many[1] - many[0] < (few[1] - few[0]) / 2
    assert many[1] < 0.05  # well calibrated, and 2,400 items can tell
