"""The pipeline benchmark's local-model mode, small: the real local model (llama.cpp's server
with its parallel slots) behind a real worker. The full figures are
`python manage.py bench_pipeline --local-model`; this proves the mode works and reports what
it says."""

import io
import json

import pytest
from django.core.management import call_command

pytestmark = [pytest.mark.integration, pytest.mark.llm]


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
