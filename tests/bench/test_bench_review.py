"""50 reviewers on one queue for a minute, through gunicorn on loopback: every decision a
reviewer was told is saved is in the database, no item is decided more often than its
reviewers per item (double submits included), and no request fails with a server error."""

import io
import json

import pytest
from django.core.management import call_command

pytestmark = [pytest.mark.integration]


def test_fifty_reviewers_for_a_minute_lose_nothing_and_decide_nothing_twice() -> None:
    out = io.StringIO()
    call_command("bench_review", "--reviewers=50", "--duration=60", "--json", stdout=out)
    result = json.loads(out.getvalue().strip().splitlines()[-1])
    assert result["reviewers"] == 50
    # The run really decided things (a few hundred when idle; far fewer beside the suite).
    assert result["decisions_acknowledged"] >= 30
    assert result["decisions_lost"] == 0
    assert result["acknowledged_twice"] == 0
    assert result["items_decided_twice"] == 0
    assert result["server_errors"] == 0
