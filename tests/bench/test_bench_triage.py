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
    call_command(
        "bench_triage",
        "--tickets=6",
        "--held-out=4",
        "--sizes=0,6",
        "--playbook-rounds=1",
        "--playbook-tickets=4",
        "--json",
        stdout=out,
    )
    result = json.loads(out.getvalue().strip().splitlines()[-1])
    assert result["structured_output"] is True
    for part in ("demo", "banking77"):
        valid = result["valid"][part]
        assert valid["proposals"] >= valid["tickets"] > 0
        assert valid["failed_calls"] == 0
        assert valid["valid_share"] >= 0.9, valid["invalid_examples"]
    assert set(result["accuracy"]) == {"0", "6"}
    assert all(row["tickets"] == 4 for row in result["accuracy"].values())

    # The playbook's arm: 4 tickets triaged by the model and decided as a reviewer would, the
    # held-out ones measured again with that memory, then a reflection on the corrected ones
    # by the same model (the 135M model may propose no rule: then no arm with one is run).
    playbook = result["playbook"]
    reviewed = playbook["reviewed"]
    assert reviewed["tickets"] == 4 and reviewed["first_right"] + reviewed["corrected"] <= 4
    assert playbook["examples_only"]["tickets"] == 4
    (first_round,) = playbook["playbook_rounds"]
    if reviewed["corrected"]:
        assert first_round["decisions"] == reviewed["corrected"]
        assert first_round["status"] in ("decided", "empty")
    arms = ("with_playbook", "playbook_alone")
    if playbook["playbook_entries"]:
        assert all(playbook[arm]["tickets"] == 4 for arm in arms)
    else:
        assert not any(arm in playbook for arm in arms)
