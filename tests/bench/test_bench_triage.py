"""The triage benchmark, small: the real worker, fastembed, Qdrant's local store and the local
SmolLM2 through litellm, asked for structured output. The full run is
`python manage.py bench_triage`; this proves the command works and that the proposals the
local model writes are valid triage (before structured output, none were)."""

import io
import json

import pytest
from django.core.management import call_command

pytestmark = [pytest.mark.integration, pytest.mark.llm]


def test_a_small_triage_run_reports_valid_proposals_as_json() -> None:
    out = io.StringIO()
    call_command("bench_triage", "--tickets=6", "--held-out=4", "--sizes=0,6", "--json", stdout=out)
    result = json.loads(out.getvalue().strip().splitlines()[-1])
    assert result["structured_output"] is True
    for part in ("demo", "banking77"):
        valid = result["valid"][part]
        assert valid["proposals"] >= valid["tickets"] > 0
        assert valid["failed_calls"] == 0
        assert valid["valid_share"] >= 0.9, valid["invalid_examples"]
    assert set(result["accuracy"]) == {"0", "6"}
    assert all(row["tickets"] == 4 for row in result["accuracy"].values())
