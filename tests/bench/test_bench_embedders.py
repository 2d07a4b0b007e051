"""The embedder benchmark, small: the product's own model folder alone, on CLINC150. The full
run (600 stored, candidates beside the baseline) is `python manage.py bench_embedders`; this
proves the command works and that kNN on real embeddings beats chance."""

import io
import json

from django.core.management import call_command

CLINC150_INTENTS = 150


def test_a_small_run_on_the_baseline_reports_accuracy_and_speed_as_json() -> None:
    out = io.StringIO()
    call_command(
        "bench_embedders",
        "--datasets=clinc150",
        "--stored=150",
        "--held-out=50",
        "--single-calls=10",
        "--batches=1",
        "--json",
        stdout=out,
    )
    lines = out.getvalue().strip().splitlines()
    result = json.loads(lines[-1])
    assert any(line.startswith("| baseline |") for line in lines[:-1])
    assert result["stored"] == 150 and result["held_out"] == 50
    assert list(result["models"]) == ["baseline"]
    row = result["models"]["baseline"]
    assert {
        "clinc150_top1",
        "clinc150_top1_ci",
        "difference_points",
        "single_p50_ms",
        "single_p95_ms",
        "batch8_texts_per_s",
        "batch32_texts_per_s",
    } <= set(row)
    low, high = row["clinc150_top1_ci"]
    assert 0 <= low <= row["clinc150_top1"] <= high <= 1
    assert row["clinc150_top1"] > 3 / CLINC150_INTENTS  # well above chance
    assert row["difference_points"] == {"clinc150": 0.0}
    assert 0 < row["single_p50_ms"] <= row["single_p95_ms"]
    assert row["batch8_texts_per_s"] > 0 and row["batch32_texts_per_s"] > 0
