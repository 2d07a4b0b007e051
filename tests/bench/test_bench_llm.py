"""The local LLM's speed benchmark (`make bench`'s first step) measures the installed build."""

import io
import json

import pytest
from django.core.management import call_command

from icrlhf.ops.local_llm import PORTABLE_BASELINE

pytestmark = [pytest.mark.integration, pytest.mark.llm]


def test_the_speed_benchmark_measures_the_installed_build() -> None:
    out = io.StringIO()
    call_command("bench_llm", "--runs=1", "--tokens=16", "--json", stdout=out)
    result = json.loads(out.getvalue().strip().splitlines()[-1])
    assert set(result["build_features"]) <= PORTABLE_BASELINE
    assert result["runs"] == 1 and result["tokens_per_answer"] > 0
    assert result["tokens_per_s_median"] > 0
