"""The fault suite, in CI: `manage.py chaos` kills the worker and the gateway (kill -9) and
the broker, cuts the vector store off and makes the LLM slow, rate-limited, failing or
nonsensical, all for real, and nothing may be lost or stuck. The table it prints is
docs/benchmarks.md's figure."""

import io
import json
from pathlib import Path

import pytest
from django.core.management import call_command

from bench.chaos import GATEWAY_KILL_AFTER, SCENARIOS

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

# Scenarios whose items end reviewable, so a reviewer decides them; in the others the LLM
# never answers, and every item must end failed with a readable message instead.
DECIDED = {
    "worker killed (kill -9) mid-generation",
    "broker restarted mid-generation",
    "broker restarted mid-decision burst",
    "vector store unavailable",
    "LLM answers 429, then recovers",
}
# Scenarios that call the gateway: every call it answered must be in its call log.
CALLED = {"gateway killed (kill -9) mid-burst"}


def test_no_decision_is_lost_and_nothing_is_stuck_under_any_fault(tmp_path: Path) -> None:
    out = io.StringIO()
    call_command("chaos", f"--out={tmp_path}", "--json", stdout=out)
    result = json.loads(out.getvalue().strip().splitlines()[-1])
    faults = {row["fault"]: row for row in result["faults"]}
    assert len(faults) == len(SCENARIOS)
    for fault, row in faults.items():
        assert row["runs"] == 1, fault
        assert row["decisions_lost"] == 0, row
        assert row["items_stuck"] == 0, row
        assert row["candidates_stuck"] == 0, row
        # The notes name where the examples stopped and the worker's last words.
        assert row["examples_unindexed"] == 0, "\n".join([str(row), *row.get("notes", [])])
        assert row["max_attempts"] <= 3, row  # LLM_MAX_RETRIES is 2 in the chaos world
        assert (row["decisions_made"] > 0) == (fault in DECIDED), row
        assert row["calls_lost"] == 0, "\n".join([str(row), *row.get("notes", [])])
        assert (row["calls_answered"] >= GATEWAY_KILL_AFTER) == (fault in CALLED), row
    assert result["decisions_lost"] == 0 and result["items_stuck"] == 0
    assert result["calls_lost"] == 0
    assert json.loads((tmp_path / "chaos.json").read_text()) == result
