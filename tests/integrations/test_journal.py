"""The journal on the machine's Redis: entries written in the order they were added (each
run's, whatever fails), each leaving only once written or set aside as a dead letter, one
writer at a time (its lock renewed through a slow write), what a dead writer left written by
the next one or by the sweep, nothing kept past its keep time, and readers that wait for an
owner's entries on their way."""

import itertools
import threading
import time
from typing import Any

import pytest

from icrlhf.integrations import journal
from tests.support.waiting import wait_for

NAME = "test"


pytestmark = pytest.mark.usefixtures("redis_cache")


class DatabaseDown(Exception):
    """What the test's `write` raises for a failure the writer is told is transient."""


class Rows:
    """The writer's `write`: keeps what it was given, in order (refusing a key when told, as
    a database refuses a row, or failing it as a database that is down; slowly when told)."""

    def __init__(self, *, slow_s: float = 0.0) -> None:
        self.written: list[str] = []
        self.refused: set[str] = set()
        self.down: set[str] = set()
        self.slow_s = slow_s
        # Each write's key, start and end (monotonic): whether one overlapped another.
        self.spans: list[tuple[str, float, float]] = []

    def __call__(self, entry: dict[str, Any]) -> None:
        if entry["key"] in self.refused:
            raise RuntimeError("the database refused the row")
        if entry["key"] in self.down:
            raise DatabaseDown("the database went away")
        started = time.monotonic()
        time.sleep(self.slow_s)
        self.written.append(entry["key"])
        self.spans.append((entry["key"], started, time.monotonic()))


def run(key: str = "", *, owner: str = "app", end_user: str = "") -> journal.Run:
    return journal.Run(owner=owner, end_user=end_user, key=key)


def added(*keys: str, of: journal.Run | None = None, keep_s: float = journal.KEEP_S) -> None:
    """Entries under `keys`, of the run `of` (else each of a run of its own)."""
    for key in keys:
        journal.add(NAME, key, {"key": key}, run=of or run(f"run-{key}"), keep_s=keep_s)


def test_entries_are_written_in_the_order_they_were_added_and_then_leave() -> None:
    rows = Rows()
    added("a", "b", "c", of=run("r"))
    assert journal.pending(NAME, "b")

    assert journal.Writer(NAME, rows).drain() == 3

    assert rows.written == ["a", "b", "c"]
    assert not journal.pending(NAME, "b")
    assert journal.Writer(NAME, rows).drain() == 0  # nothing twice


def test_an_entry_that_cannot_be_written_yet_stays_until_it_can() -> None:
    rows = Rows()
    rows.refused = {"b"}
    added("a", "b", "c")

    assert journal.Writer(NAME, rows).drain() == 2  # the one refused is not counted
    assert rows.written == ["a", "c"]
    assert journal.pending(NAME, "b")

    rows.refused = set()
    assert journal.Writer(NAME, rows).drain() == 1
    assert rows.written == ["a", "c", "b"]


def test_the_writers_thread_writes_as_entries_arrive_and_writes_the_rest_as_it_stops() -> None:
    rows = Rows()
    writer = journal.Writer(NAME, rows)
    writer.start()
    try:
        added("a", "b")
        wait_for(lambda: rows.written == ["a", "b"], what="the two entries written")
        added("c")
    finally:
        writer.stop()
    assert rows.written == ["a", "b", "c"]
    assert not journal.pending(NAME, "c")


def test_one_writer_at_a_time_and_the_sweep_waits_for_a_live_one() -> None:
    first, second = Rows(), Rows()
    holding = journal.Writer(NAME, first)
    holding.start()
    try:
        wait_for(lambda: holding._held is not None, what="the lock")
        added("a")
        assert journal.Writer(NAME, second).drain() == 0
        assert journal.sweep(NAME, second) == 0
        wait_for(lambda: first.written == ["a"], what="the holder writing it")
    finally:
        holding.stop()
    assert second.written == []


def test_what_a_killed_writer_left_is_written_by_the_sweep_once_its_lock_expires() -> None:
    rows = Rows()
    dead = journal.Writer(NAME, rows)
    assert dead._hold()
    added("a", "b")
    # Killed mid-write: it took "a" off the list, never wrote it, and holds the lock still.
    assert dead._taken(wait_s=0) == ["a", "b"]
    assert journal.sweep(NAME, rows) == 0
    assert dead._held is not None
    dead._held._released.set()  # killed: its lock is no longer renewed
    dead._held.lock.do_release(dead._held.lock.local.token)  # its expiry

    assert journal.sweep(NAME, rows) == 2
    assert rows.written == ["a", "b"]


def test_a_reader_waits_for_an_entry_on_its_way_and_not_for_one_written() -> None:
    rows = Rows()
    added("a")
    writer = journal.Writer(NAME, rows)
    threading.Timer(0.2, writer.drain).start()

    started = time.monotonic()
    assert journal.waited_for(NAME, "a", timeout_s=5)
    assert rows.written == ["a"]
    assert 0.1 < time.monotonic() - started < 5
    assert not journal.waited_for(NAME, "a", timeout_s=5)


def test_a_reader_that_cannot_name_its_entry_waits_for_all_waiting_now() -> None:
    rows = Rows()
    added("a", "b")
    threading.Timer(0.2, journal.Writer(NAME, rows).drain).start()

    assert journal.waited_for_all(NAME, timeout_s=5)
    assert rows.written == ["a", "b"]
    assert not journal.waited_for_all(NAME, timeout_s=5)


def test_without_redis_there_is_no_journal(settings: Any) -> None:
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

    assert not journal.available()
    with pytest.raises(journal.JournalUnavailable):
        journal.add(NAME, "a", {"key": "a"}, run=run())
    assert not journal.waited_for(NAME, "a", timeout_s=5)
    assert journal.sweep(NAME, Rows()) == 0


def test_an_entry_left_unwritten_holds_back_its_runs_later_entries_and_no_others() -> None:
    rows = Rows()
    agent, other = run("r"), run("s")
    added("a1", of=agent)
    added("b1", of=other)
    added("a2", of=agent)
    added("u1", of=run("", end_user="ann"))
    added("u2", of=run("", end_user="ann"))  # an unnamed run: all of ann's unnamed entries
    added("a3", of=agent)
    rows.refused = {"a1"}
    rows.down = {"u1"}
    writer = journal.Writer(NAME, rows, transient=(DatabaseDown,))
    assert writer._hold()

    for key in writer._taken(wait_s=0):  # as the writer's thread takes them
        writer._write_one(key)
    assert rows.written == ["b1"]
    assert all(journal.pending(NAME, key) for key in ("a1", "a2", "a3", "u1", "u2"))

    rows.refused, rows.down = set(), set()
    assert writer.catch_up() == 5
    assert rows.written == ["b1", "a1", "a2", "u1", "u2", "a3"]


def test_an_entry_refused_again_and_again_becomes_a_dead_letter_and_frees_its_run() -> None:
    rows = Rows()
    agent = run("r")
    added("a1", "a2", of=agent)
    rows.refused = {"a1"}
    for _ in range(journal.TRIES - 1):
        assert journal.Writer(NAME, rows).drain() == 0
        assert rows.written == [] and journal.pending(NAME, "a1")
    assert journal.counts(NAME) == journal.Counts(waiting=2, dead_letters=0)

    assert journal.Writer(NAME, rows).drain() == 1  # its last try: set aside, a2 goes on

    assert rows.written == ["a2"]
    assert journal.counts(NAME) == journal.Counts(waiting=0, dead_letters=1)
    [letter] = journal.dead_letters(NAME)
    assert letter["key"] == "a1" and letter["entry"] == {"key": "a1"}
    assert "the database refused the row" in letter["error"]


def test_a_database_that_is_down_makes_no_dead_letter() -> None:
    rows = Rows()
    added("a")
    rows.down = {"a"}
    for _ in range(journal.TRIES + 1):
        assert journal.Writer(NAME, rows, transient=(DatabaseDown,)).drain() == 0

    assert journal.counts(NAME) == journal.Counts(waiting=1, dead_letters=0)
    rows.down = set()
    assert journal.sweep(NAME, rows, transient=(DatabaseDown,)) == 1


def test_dead_letters_are_bounded_keeping_the_newest(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(journal, "DEAD_MAX", 3)
    monkeypatch.setattr(journal, "TRIES", 1)
    rows = Rows()
    keys = [f"k{n}" for n in range(5)]
    rows.refused = set(keys)
    added(*keys)

    journal.Writer(NAME, rows).drain()

    assert journal.counts(NAME) == journal.Counts(waiting=0, dead_letters=3)
    assert [letter["key"] for letter in journal.dead_letters(NAME)] == ["k4", "k3", "k2"]


def test_nothing_outlives_the_keep_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Neither an entry nobody could write, nor a dead letter, nor a key renewed by every
    new entry: what end users wrote leaves the journal with the call log's retention."""
    monkeypatch.setattr(journal, "TRIES", 2)
    rows = Rows()
    rows.refused = {"old", "dead"}
    added("dead", "old", keep_s=60)
    journal.Writer(NAME, rows, keep_s=60).drain()  # "dead" tried once, "old" too
    rows.refused = {"dead"}
    journal.Writer(NAME, rows, keep_s=60).drain()  # "dead" set aside, "old" written
    rows.refused = {"old"}
    added("old", keep_s=60)  # again, refused once more: it waits
    journal.Writer(NAME, rows, keep_s=60).drain()
    assert journal.counts(NAME) == journal.Counts(waiting=1, dead_letters=1)
    entries, order, _ = journal._keys(NAME)
    client = journal._client()
    assert 0 < client.ttl(entries) <= 60 and 0 < client.ttl(journal._dead_key(NAME)) <= 60

    later = time.time() + 61
    monkeypatch.setattr(journal.time, "time", lambda: later)
    added("new", keep_s=60)
    journal.Writer(NAME, rows, keep_s=60).drain()

    assert journal.counts(NAME) == journal.Counts(waiting=0, dead_letters=0)
    assert rows.written[-1] == "new" and not journal.pending(NAME, "old")


def test_a_write_slower_than_the_locks_life_keeps_the_lock_and_each_runs_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(journal, "_LOCK_S", 0.3)
    slow, rival = Rows(slow_s=0.5), Rows()
    added("a1", of=run("r"))
    added("b1", of=run("s"))
    added("a2", of=run("r"))
    added("a3", of=run("r"))
    writer = journal.Writer(NAME, slow)
    writer.start()
    try:
        wait_for(lambda: slow.spans, what="a first slow write")
        # A second writer tries to take over for longer than the lock's life, many times over.
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            assert journal.Writer(NAME, rival).drain() == 0
            time.sleep(0.05)
        wait_for(lambda: len(slow.written) == 4, what="the four entries written")
    finally:
        writer.stop()

    assert rival.written == []
    assert slow.written == ["a1", "b1", "a2", "a3"]
    spans = [span for span in slow.spans if span[0].startswith("a")]
    assert all(earlier[2] <= later[1] for earlier, later in itertools.pairwise(spans))


def test_a_writer_that_lost_its_lock_stops_writing(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = Rows()
    added("a", "b")
    writer = journal.Writer(NAME, rows)
    assert writer._hold() and writer._held is not None
    held = writer._held
    held._released.set()  # its keeper stopped, as in a process frozen past the lock's life
    held.lock.do_release(held.lock.local.token)
    held._renewed_at -= journal._LOCK_S  # and it has not renewed it since

    for key in writer._taken(wait_s=0):
        if not writer._still_held():
            break
        writer._write_one(key)

    assert rows.written == [] and journal.pending(NAME, "a") and journal.pending(NAME, "b")


def test_a_reader_waits_only_for_its_owners_entries_of_the_run_it_names() -> None:
    rows = Rows()
    added("mine", of=run("refund-7", owner="app"))
    added("same-owner-other-run", of=run("refund-8", owner="app"))
    added("other-owner", of=run("refund-7", owner="another-app"))
    added("unnamed", of=run("", owner="app"))

    started = time.monotonic()
    assert not journal.waited_for_run(NAME, owner="app", run_key="unknown", timeout_s=5)
    assert not journal.waited_for_run(NAME, owner="app", run_key="", timeout_s=5)
    assert not journal.waited_for(NAME, "other-owner", owner="app", timeout_s=5)
    assert time.monotonic() - started < 0.5

    threading.Timer(0.2, journal.Writer(NAME, rows).drain).start()
    assert journal.waited_for_run(NAME, owner="app", run_key="refund-7", timeout_s=5)
    assert "mine" in rows.written
    assert not journal.waited_for(NAME, "mine", owner="app", timeout_s=5)


def dead(*keys: str, rows: Rows, keep_s: float = journal.KEEP_S) -> None:
    """Entries under `keys`, each of a run of its own, set aside as dead letters."""
    added(*keys, keep_s=keep_s)
    rows.refused |= set(keys)
    for _ in range(journal.TRIES):
        journal.Writer(NAME, rows, keep_s=keep_s).drain()
    assert set(keys) <= {letter["key"] for letter in journal.dead_letters(NAME)}


def test_dead_letters_written_again_leave_and_those_failing_again_stay_with_their_error() -> None:
    rows = Rows()
    dead("a", "b", "c", rows=rows)
    assert {letter["tries"] for letter in journal.dead_letters(NAME)} == {journal.TRIES}
    rows.refused = {"b"}  # the cause fixed, but for b
    rows.down = {"c"}  # and c meets a database that is down (not refused, but not written)

    retried = journal.dead_letters_retry(NAME, rows)

    assert retried == journal.Retried(written=1, kept=2, expired=0)
    assert rows.written == ["a"]
    c, b = journal.dead_letters(NAME)  # the list's order kept: newest first
    assert (b["key"], b["tries"]) == ("b", journal.TRIES + 1)
    assert (c["key"], c["tries"], c["error"]) == (
        "c",
        journal.TRIES + 1,
        "DatabaseDown: the database went away",
    )

    rows.refused, rows.down = set(), set()
    assert journal.dead_letters_retry(NAME, rows) == journal.Retried(written=2, kept=0, expired=0)
    assert rows.written == ["a", "b", "c"]  # oldest first
    assert journal.counts(NAME) == journal.Counts(waiting=0, dead_letters=0)


def test_dead_letters_past_the_keep_time_are_dropped_unwritten_by_a_retry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rows = Rows()
    dead("old", rows=rows, keep_s=60)
    later = time.time() + 61
    monkeypatch.setattr(journal.time, "time", lambda: later)
    rows.refused = set()

    assert journal.dead_letters_retry(NAME, rows, keep_s=60) == journal.Retried(
        written=0, kept=0, expired=1
    )
    assert rows.written == [] and journal.counts(NAME).dead_letters == 0


def test_discarding_drops_the_dead_letters_and_says_how_many() -> None:
    rows = Rows()
    dead("a", "b", rows=rows)

    assert journal.dead_letters_discard(NAME) == 2

    assert journal.counts(NAME).dead_letters == 0
    assert journal.dead_letters_discard(NAME) == 0


def test_a_letter_discarded_while_a_retry_writes_it_is_not_brought_back() -> None:
    rows = Rows()
    dead("a", rows=rows)

    def discarded_meanwhile(entry: dict[str, Any]) -> None:
        journal.dead_letters_discard(NAME)  # another operator, while this write fails
        raise RuntimeError("the database refused the row")

    assert journal.dead_letters_retry(NAME, discarded_meanwhile).kept == 1
    assert journal.counts(NAME).dead_letters == 0


def test_a_letter_discarded_while_the_writer_purges_is_not_brought_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The purge (the writer's, under its lock) and an operator's command (under none) may
    meet: the purge removes only what it found too old."""
    monkeypatch.setattr(journal, "TRIES", 1)
    rows = Rows()
    start = time.time()
    dead("old", rows=rows, keep_s=60)
    monkeypatch.setattr(journal.time, "time", lambda: start + 31)
    dead("new", rows=rows, keep_s=60)
    monkeypatch.setattr(journal.time, "time", lambda: start + 62)  # "old" is too old now
    read = journal._letters

    def read_then_discarded_test_double(name: str) -> list[str]:
        letters = read(name)
        journal._client().delete(journal._dead_key(name))  # an operator's discard, meanwhile
        return letters

    monkeypatch.setattr(journal, "_letters", read_then_discarded_test_double)
    journal.Writer(NAME, rows, keep_s=60).drain()

    assert journal._client().llen(journal._dead_key(NAME)) == 0
