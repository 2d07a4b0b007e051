"""The pipeline benchmark's modes, small: the local-model mode (the real local model, llama.cpp's
server with its parallel slots, behind a real worker) and the waiting mode (a real worker and
Redis, review's share of an endpoint held). The full figures are `python manage.py
bench_pipeline --local-model` and `--waiting 1,10,100`; these prove the modes work and report
what they say."""

import io
import json

import pytest
from django.core.management import call_command

pytestmark = pytest.mark.integration


@pytest.mark.llm
def test_the_local_model_mode_times_the_first_candidate_and_all_of_them() -> None:
    out = io.StringIO()
    call_command(
        "bench_pipeline", "--local-model", "--sizes=1,4", "--repeats=1", "--json", stdout=out
    )
    lines = out.getvalue().strip().splitlines()
    result = json.loads(lines[-1])
    assert result["mode"] == "local-model" and result["slots"] == 4
    for size in ("1", "4"):
        row = result["sizes"][size]
        assert 0 < row["first_s"] <= row["all_s"]
        assert row["tokens_per_answer"] > 0
    assert result["all_4_over_1"] == result["sizes"]["4"]["all_s"] / result["sizes"]["1"]["all_s"]
    assert any(line.startswith("All 4 ready in") for line in lines)


def test_the_waiting_mode_measures_the_worker_while_generations_wait_in_line() -> None:
    """`bench_pipeline --waiting`: each level's generations wait in line behind a held slot,
    and its first in line is woken when the slot comes back (the benchmark waits for it)."""
    out = io.StringIO()
    call_command(
        "bench_pipeline", "--waiting=1,3", "--window=1", "--hold=300", "--json", stdout=out
    )
    lines = out.getvalue().strip().splitlines()
    result = json.loads(lines[-1])
    assert result["mode"] == "waiting" and result["longest_hold_s"] == 300
    assert [level["waiting"] for level in result["levels"]] == [1, 3]
    for level in result["levels"]:
        assert level["held_throughout"] is True
        assert level["worker_cpu_percent"] >= 0 and level["woken_after_ms"] >= 0
    assert lines[1].split("|")[0].strip() == "waiting"
