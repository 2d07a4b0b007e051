"""The load generator's pure part: reading hey's CSV and splitting a run into its first burst
and its steady state (no process)."""

import pytest

from bench.loadgen import _parsed

# hey writes a row as each call ends, so rows are not in the order the calls started: three
# clients, six calls, one answered 500 and one with no answer at all (no row).
CSV = """response-time,DNS+dialup,DNS,Request-write,Response-delay,Response-read,status-code,offset
0.2000,0.0001,0.0000,0.0000,0.1990,0.0001,200,0.0003
0.2500,0.0001,0.0000,0.0000,0.2490,0.0001,500,0.0001
0.2100,0.0001,0.0000,0.0000,0.2090,0.0001,200,0.2005
0.3000,0.0001,0.0000,0.0000,0.2990,0.0001,200,0.0002
0.2200,0.0001,0.0000,0.0000,0.2190,0.0001,200,0.2504
"""


def test_it_splits_the_answered_calls_by_start_into_the_first_burst_and_the_rest() -> None:
    load = _parsed(CSV, calls=6, clients=3)

    first_burst, steady = load.first_burst_and_steady()

    # The three calls that started first, less the one answered 500; then the rest.
    assert first_burst == pytest.approx([300.0, 200.0])
    assert steady == pytest.approx([210.0, 220.0])
    assert sorted(first_burst + steady) == sorted(load.answered_ms)
    assert load.errors == 2
    assert load.elapsed_s == pytest.approx(0.4704)


def test_with_one_client_the_first_burst_is_the_first_call_to_start() -> None:
    first_burst, steady = _parsed(CSV, calls=6, clients=1).first_burst_and_steady()

    assert first_burst == []  # the first call to start was answered 500
    assert steady == pytest.approx([300.0, 200.0, 210.0, 220.0])
