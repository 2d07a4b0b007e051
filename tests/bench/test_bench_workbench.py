"""The reviewer's-day benchmark drives a real browser through real decisions with the keyboard
alone: every decision lands, and Submit is in view on every item as it opens. Its step-review
path decides captured agent steps (tool-call candidates) by keyboard, each for the action meant.
Its triage path triages tickets whose proposals the real local model wrote, each to its true
category."""

import io
import json

import pytest
from django.core.management import call_command

pytestmark = [pytest.mark.integration, pytest.mark.llm]


def test_a_keyboard_only_reviewer_decides_every_item_with_submit_always_in_view() -> None:
    out = io.StringIO()
    call_command(
        "bench_workbench",
        "--decisions=5",
        "--latency=0.5",
        "--steps=5",
        "--triage-tickets=3",
        "--json",
        stdout=out,
    )
    result = json.loads(out.getvalue().strip().splitlines()[-1])
    assert result["decisions"] == 5
    assert result["command_keys_per_decision"] == pytest.approx((4 * 2 + 4) / 5)
    assert result["submit_in_view_share"] == 1.0
    assert result["page_height_p50_px"] < 1500
    # Each captured step decided by keyboard: its number and Enter, every fifth an edit of its
    # note; each decision recorded the action meant, the edit with its words.
    assert result["step_decisions"] == 5
    assert result["step_keystrokes_p50"] == 2  # a digit and a submit
    assert result["step_keystrokes_per_decision"] > 2  # the edit types its words
    assert result["step_right_share"] == 1.0
    assert result["step_edits_saved"] == 1
    # From the step shown to the decision saved: no reading time, so the page and the server.
    assert 0 < result["step_seconds_p50"] <= result["step_seconds_p95"] < 10
    # Each ticket triaged by keyboard to its true category (one may fail to generate on a
    # busy machine: it is counted apart, never waited for forever).
    assert result["triage_tickets"] + result["triage_not_generated"] == 3
    assert result["triage_tickets"] >= 2
    assert result["triage_valid_share"] >= 0.75  # structured output (none were valid before)
    assert result["triage_keystrokes_correct_p50"] in (None, 2)  # its number, then Enter
    assert result["triage_keystrokes_p50"] >= 2
