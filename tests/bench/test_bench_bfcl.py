"""The BFCL benchmark: its checker against real BFCL entries (the `bfcl-eval` package's data),
and the command, small, through the real stack (world, worker, gateway process) with the
fixed-answer endpoint as the model (it calls the first tool offered with a `query` argument,
which no BFCL function takes: every call is a call, none is right)."""

import io
import json
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from bench import bfcl
from tests.support.fixed_latency_llm import FixedLatencyLLM


def _gold(entry: bfcl.Entry) -> list[tuple[str, Any]]:
    return [
        (call["function"]["name"], json.loads(call["function"]["arguments"]))
        for call in bfcl.gold_calls(entry)
    ]


def _entry(category: str, entry_id: str) -> bfcl.Entry:
    return next(e for e in bfcl.entries(category) if e.id == entry_id)


def test_every_gold_call_passes_the_checker_in_any_order() -> None:
    for category in bfcl.CATEGORIES:
        for entry in bfcl.entries(category):
            gold = _gold(entry)
            assert bfcl.calls_correct(entry, gold), entry.id
            assert bfcl.calls_correct(entry, gold[::-1]), entry.id


def test_the_checker_is_strict_about_names_values_and_counts() -> None:
    # simple_python_0: calculate_triangle_area(base=10, height=5, unit optional: "units").
    triangle = _entry("simple_python", "simple_python_0")
    right = {"base": 10, "height": 5}
    assert bfcl.calls_correct(triangle, [("calculate_triangle_area", right)])
    assert bfcl.calls_correct(triangle, [("calculate_triangle_area", {**right, "unit": "Units"})])
    assert not bfcl.calls_correct(triangle, [("calculate_triangle_area", {**right, "base": 11})])
    assert not bfcl.calls_correct(triangle, [("calculate_triangle_area", {"base": 10})])
    assert not bfcl.calls_correct(triangle, [("calculate_triangle_area", {**right, "x": 1})])
    assert not bfcl.calls_correct(triangle, [("triangle_area", right)])
    assert not bfcl.calls_correct(triangle, [("calculate_triangle_area", {**right, "base": "10"})])
    assert not bfcl.calls_correct(triangle, [("calculate_triangle_area", "base=10")])
    assert not bfcl.calls_correct(triangle, [])
    assert not bfcl.calls_correct(triangle, [("calculate_triangle_area", right)] * 2)
    # math.factorial is called math_factorial by an OpenAI client (no dots in names).
    factorial = _entry("simple_python", "simple_python_1")
    assert bfcl.openai_tool(factorial.functions[0])["function"]["name"] == "math_factorial"
    assert bfcl.calls_correct(factorial, [("math_factorial", {"number": 5})])
    # parallel_0: two spotify_play calls, any order, each its own values.
    songs = _entry("parallel", "parallel_0")
    swift = ("spotify_play", {"artist": "Taylor Swift", "duration": 20})
    maroon = ("spotify_play", {"artist": "Maroon 5", "duration": 15})
    assert bfcl.calls_correct(songs, [maroon, swift])
    assert not bfcl.calls_correct(songs, [swift, swift])
    assert not bfcl.calls_correct(songs, [swift])


def test_bfcls_types_become_json_schemas() -> None:
    tool = bfcl.openai_tool(_entry("simple_python", "simple_python_0").functions[0])
    assert tool["function"]["parameters"]["type"] == "object"
    assert tool["function"]["parameters"]["required"] == ["base", "height"]


def test_the_held_back_live_categories_are_refused() -> None:
    with pytest.raises(ValueError, match="held-back"):
        bfcl.entries("live_simple")
    with pytest.raises(CommandError, match="live_simple"):
        call_command("bench_bfcl", "--categories=live_simple", stdout=io.StringIO())


@pytest.mark.integration
def test_the_benchmark_runs_small_and_prints_its_figures(fixed_llm: FixedLatencyLLM) -> None:
    out = io.StringIO()
    call_command(
        "bench_bfcl",
        "--stored=0,4",
        "--held-out=3",
        f"--llm-api-base={fixed_llm.api_base}",
        "--json",
        stdout=out,
    )
    result = json.loads(out.getvalue().strip().splitlines()[-1])
    assert result["held_out"] == 3 and result["stored"] == [0, 4]
    assert set(result["arms"]) == {"empty", "same_tool_set_4", "format_examples_4"}
    assert len({i.split("_")[0] for i in result["held_out_ids"]}) == 3  # one per category
    for row in result["arms"].values():
        assert row["calls"] == 3 and row["failed_calls"] == 0, row["first_error"]
        assert row["any_call"] == 1.0 and row["accuracy"] == 0.0  # its calls take `query`
        assert row["accuracy_ci95"][0] == 0.0 < row["accuracy_ci95"][1] < 1.0
        assert row["foreign_calls"] == 0  # the gateway never lets one through
        assert row["lost_to_deadline"] == 0 and row["time"]["asked_twice"] == 0
        assert row["time"]["model_prompt_ms"] == {"p50": 3.0, "p95": 3.0}  # as the double says
        assert set(row["by_category"]) == set(bfcl.CATEGORIES)


@pytest.mark.integration
@pytest.mark.llm
def test_a_burst_of_tool_calls_to_the_local_model_loses_none_to_the_deadline() -> None:
    """The burst of issue 60, small: tool calls 4 at a time through the real gateway to the
    real local model, under the stack's own deadlines (LLM_TIMEOUT_S 60 s), none lost, and
    the call log says where each call's time went."""
    out = io.StringIO()
    call_command(
        "bench_bfcl",
        "--stored=0",
        "--held-out=8",
        "--categories=simple_python",
        "--concurrency=4",
        "--max-tokens=96",
        "--llm-timeout=60",
        "--json",
        stdout=out,
    )
    row = json.loads(out.getvalue().strip().splitlines()[-1])["arms"]["empty"]
    assert row["calls"] == 8
    assert row["lost_to_deadline"] == 0 and row["refused_too_busy"] == 0
    assert row["failed_calls"] == 0, row["first_error"]
    spent = row["time"]
    assert spent["prompt_tokens"]["p50"] > 50  # the tool's schema is in the prompt
    assert spent["model_prompt_ms"]["p50"] > 0 and spent["model_generation_ms"]["p50"] > 0
    assert spent["waited_ms"]["p95"] is not None
    assert "lost to the deadline" in out.getvalue()
