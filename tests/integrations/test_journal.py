"""The journal on the machine's Redis: entries written in the order they were added, each
leaving only once written, one writer at a time, what a dead writer left written by the next
one or by the sweep, and readers that wait for an entry on its way."""

import threading
import time
from typing import Any

import pytest

from icrlhf.integrations import journal
from tests.conftest import wait_for

NAME = "test"


pytestmark = pytest.mark.usefixtures("redis_cache")


class Rows:
    """The writer's `write`: keeps what it was given, in order (refusing a key when told)."""

    def __init__(self) -> None:
        self.written: list[str] = []
        self.refused: set[str] = set()

    def __call__(self, entry: dict[str, Any]) -> None:
        if entry["key"] in self.refused:
            raise RuntimeError("the database went away")
        self.written.append(entry["key"])


def added(*keys: str) -> None:
    for key in keys:
        journal.add(NAME, key, {"key": key})


def test_entries_are_written_in_the_order_they_were_added_and_then_leave() -> None:
    rows = Rows()
    added("a", "b", "c")
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
        wait_for(lambda: holding._lock is not None and holding._lock.owned(), what="the lock")
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
    dead._lock.do_release(dead._lock.local.token)  # type: ignore[union-attr]  # its expiry

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
        journal.add(NAME, "a", {"key": "a"})
    assert not journal.waited_for(NAME, "a", timeout_s=5)
    assert journal.sweep(NAME, Rows()) == 0
