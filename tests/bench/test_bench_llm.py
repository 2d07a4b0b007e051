"""The local LLM's speed benchmark (`make bench`'s first step) measures the installed build."""

import io
import json

import pytest
from django.core.management import call_command

from icrlhf.ops.local_llm import PORTABLE_BASELINE
from tests.support.fixed_latency_llm import FixedLatencyLLM

pytestmark = [pytest.mark.integration, pytest.mark.llm]


def test_the_speed_benchmark_measures_the_installed_build() -> None:
    out = io.StringIO()
    call_command("bench_llm", "--runs=1", "--tokens=16", "--json", stdout=out)
    result = json.loads(out.getvalue().strip().splitlines()[-1])
    assert set(result["build_features"]) <= PORTABLE_BASELINE
    assert result["runs"] == 1 and result["tokens_per_answer"] > 0
    assert result["tokens_per_s_median"] > 0


def test_another_endpoint_is_measured_when_named(
    fixed_llm: FixedLatencyLLM,
) -> None:
    """`--llm-api-base` measures that server as any client sees it, and starts no local one."""
    out = io.StringIO()
    call_command(
        "bench_llm",
        "--runs=2",
        f"--llm-api-base={fixed_llm.api_base}",
        "--llm-model=openai/elsewhere",
        "--json",
        stdout=out,
    )
    lines = out.getvalue().strip().splitlines()
    result = json.loads(lines[-1])
    assert result["build_features"] == [] and result["threads"] is None
    assert result["runs"] == 2 and result["tokens_per_answer"] == 12  # the fixed server's
    assert lines[0].startswith(f"elsewhere at {fixed_llm.api_base}:")


def test_answers_asked_at_once_are_measured_together(fixed_llm: FixedLatencyLLM) -> None:
    """`--concurrent`: a run asks that many answers at once; their tokens over the time until
    the last ended is the server's speed together (the fixed server answers all three at
    once, in one answer's time)."""
    out = io.StringIO()
    call_command(
        "bench_llm",
        "--runs=2",
        "--concurrent=3",
        f"--llm-api-base={fixed_llm.api_base}",
        "--llm-model=openai/elsewhere",
        "--json",
        stdout=out,
    )
    result = json.loads(out.getvalue().strip().splitlines()[-1])
    assert result["concurrent"] == 3 and result["runs"] == 2
    assert result["tokens_per_answer"] == 12
    assert result["tokens_per_s_together"] > 1.5 * result["tokens_per_s_median"]
