"""The learning-curve benchmark, small: the real loop (worker on Redis, Qdrant local store,
fastembed, the local LLM through litellm) on a slice of Banking77. The full curve is
`python manage.py bench_learning`; this proves the command works and memory helps."""

import io
import json
from pathlib import Path

import pytest
from django.core.management import call_command

pytestmark = [pytest.mark.integration, pytest.mark.llm]


def test_a_small_learning_curve_rises_with_stored_decisions(tmp_path: Path) -> None:
    out = io.StringIO()
    call_command(
        "bench_learning",
        "--sizes=0,40",
        "--test=20",
        "--control=5",
        "--baseline=10",
        "--candidates=3",
        "--memory-candidates=2",
        "--sweep=-1,0.5",
        # In-context RL: rewards beside examples, ratings as rewards, and "try again" rounds.
        "--example-rewards",
        "--ratings",
        "--try-again",
        f"--out={tmp_path}",
        "--json",
        stdout=out,
    )
    lines = out.getvalue().strip().splitlines()
    result = json.loads(lines[-1])
    empty, learned = result["sizes"]["0"], result["sizes"]["40"]
    for row in (empty, learned):
        assert {"first_accuracy", "acceptance", "knn_top1", "no_retrieval"} <= row.keys()
        assert row["acceptance"] >= row["first_accuracy"]  # the first is one of the N
    assert empty["knn_top1"] is None  # nothing stored, nothing to copy
    assert empty["llm_calls_saved"] == 0
    # Memory answers some candidates without the LLM, and the right intent appears more often.
    assert learned["llm_calls_saved"] > 0
    assert learned["acceptance"] > empty["acceptance"]
    # Ranked by memory's vote (the queue is not calibrated this early), the first candidate is
    # about the nearest example's answer: a tie may go the other way on one of the 20.
    assert learned["first_accuracy"] >= learned["knn_top1"] - 0.05
    assert "calibrated_n" in learned
    assert empty["no_retrieval"] == learned["no_retrieval"]  # measured once
    assert set(result["significance"]) == {"0→40"}
    # What the best-of-N missed is tried again at the largest size, against generating it
    # afresh: both over the same messages, one round each.
    assert result["example_rewards"] is True and result["ratings"] is True
    assert (result["dataset"], result["votes"]) == ("banking77", "label")
    assert learned["try_again_recovered_n"] == learned["regenerate_recovered_n"] > 0
    assert learned["try_again_llm_right_n"] > 0
    assert any(line.startswith("Missed by every candidate, then tried again: ") for line in lines)
    assert json.loads((tmp_path / "learning.json").read_text())["sizes"] == result["sizes"]
    assert (tmp_path / "learning.svg").read_text().startswith("<svg")
    assert any(line.startswith("     40 |") for line in lines)  # the printed table

    # The minimum similarity is swept at the one size with a memory, the curve's own included.
    sweep = result["min_similarity_sweep"]["40"]
    assert [row["minimum"] for row in sweep] == sorted({-1.0, 0.5, result["min_similarity"]})
    unlimited, strict = sweep[0], sweep[-1]
    for row in sweep:
        assert {"first_accuracy", "acceptance", "with_examples", "off_topic_with_examples"} <= (
            row.keys()
        )
    # With no minimum every request is given examples, unrelated ones included; a strict
    # minimum keeps memory away from unrelated requests.
    assert unlimited["with_examples"] == 1.0 and unlimited["off_topic_with_examples"] == 1.0
    assert strict["off_topic_with_examples"] == 0.0
    assert strict["with_examples"] <= unlimited["with_examples"]
    assert result["chosen_min_similarity"] in {row["minimum"] for row in sweep}
    assert any(line.startswith("Chosen minimum similarity: ") for line in lines)
