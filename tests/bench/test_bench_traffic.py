"""The production replay benchmark, small: the real gateway process and worker, the
fixed-latency endpoint (which never names an intent, so whatever is served right came from
memory), capture of every call, and the simulated reviewer closing the loop."""

import io
import json

import pytest
from django.core.management import call_command

from tests.support.fixed_latency_llm import FixedLatencyLLM

pytestmark = [pytest.mark.integration]


def test_the_replay_learns_from_its_captured_calls_and_reports_per_window(
    fixed_llm: FixedLatencyLLM,
) -> None:
    out = io.StringIO()
    call_command(
        "bench_traffic",
        "--calls=40",
        "--repeat=0.5",
        "--capture=100",
        "--holdout=30",
        "--candidates=2",
        "--review-every=5",
        f"--llm-api-base={fixed_llm.api_base}",
        "--json",
        stdout=out,
    )
    printed = out.getvalue().strip().splitlines()
    result = json.loads(printed[-1])
    assert "1–40" in printed[1] and len(result["windows"]) == 1
    assert result["calls"] == 40 and result["decisions"] > 0
    assert result["captured_share"] > 0.3  # every call but the duplicates of captured ones
    # Repeats of reviewed requests were answered from memory with the reviewer's intent; the
    # model alone (the holdout) never names one.
    assert result["from_memory_share"] > 0
    assert result["accuracy_memory_last"] > 0
    assert result["accuracy_holdout_all"] == 0
