"""The shared counters behind every limit, in the machine's real Redis (one script per
operation) and in Django's local-memory cache (the fallback without Redis): the same answers
from both, atomic under threads, and readable through Django's cache."""

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import redis
from django.core.cache import cache

from icrlhf.accounts.ratelimit import attempt_allowed
from icrlhf.gateway import limits
from icrlhf.integrations import counters
from tests.support.caches import cache_in_redis


@pytest.fixture(params=["redis", "memory"])
def store(request: pytest.FixtureRequest, settings: Any) -> str:
    """Django's cache, as an install configures it: Redis or one process's memory."""
    if request.param == "redis":
        cache_in_redis(settings)
    else:
        settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    return str(request.param)


def test_a_count_starts_at_zero_adds_its_older_buckets_and_is_read_by_django(store: str) -> None:
    assert counters.add("calls:2", 1, timeout_s=60) == 1
    assert counters.add("calls:2", 2, timeout_s=60) == 3
    assert counters.add("calls:1", 4, timeout_s=60) == 4
    # The current bucket, plus the older ones that exist (a missing one counts as none).
    assert counters.add("calls:3", 1, timeout_s=60, plus=["calls:2", "calls:1", "calls:0"]) == 8
    assert cache.get("calls:2") == 3 and cache.get("calls:3") == 1


def test_a_count_taken_back_never_comes_back_once_expired(store: str) -> None:
    counters.add("slots", 2, timeout_s=60)
    counters.subtract("slots", 1)
    assert cache.get("slots") == 1
    cache.delete("slots")  # as when its time to live runs out
    counters.subtract("slots", 1)
    assert cache.get("slots") is None  # not brought back at -1, with no time to live


def test_a_count_in_redis_lives_as_long_as_it_was_given_from_its_first_add(
    settings: Any,
) -> None:
    cache_in_redis(settings)
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    key = cache.make_and_validate_key("window")
    counters.add("window", 1, timeout_s=61)
    client.expire(key, 30)
    counters.add("window", 1, timeout_s=61)  # a window's count does not outlive its window
    assert 28 <= client.ttl(key) <= 30
    counters.subtract("window", 1)
    assert 28 <= client.ttl(key) <= 30 and cache.get("window") == 1


def test_counts_made_at_once_are_each_counted_once(store: str) -> None:
    with ThreadPoolExecutor(max_workers=16) as pool:
        totals = list(pool.map(lambda _: counters.add("race", 1, timeout_s=60), range(200)))
    assert sorted(totals) == list(range(1, 201))


def test_the_limits_hold_on_the_shared_counters(
    settings: Any, store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Calls in flight: refused past the cap, given back, aged out with their bucket; attempts
    per minute: a refused attempt is not counted."""
    settings.GATEWAY_MAX_IN_FLIGHT_PER_TOKEN = 2
    settings.GATEWAY_CALL_DEADLINE_S = 60
    now = 1_000_000.0
    monkeypatch.setattr(limits, "clock", lambda: now)
    held = [limits.in_flight_acquire(7), limits.in_flight_acquire(7)]
    assert all(held) and limits.in_flight_acquire(7) is None
    assert limits.in_flight_acquire(8) is not None  # another token's own share
    limits.in_flight_release(held.pop())
    assert limits.in_flight_acquire(7) is not None
    now += 60 + 2 * limits.BUCKET_S
    assert limits.in_flight_acquire(7) is not None  # the old slots no longer count

    assert [attempt_allowed("test", "me", per_minute=3, cost=2) for _ in range(3)] == [
        True,
        False,
        False,
    ]
    assert attempt_allowed("test", "me", per_minute=3, cost=1)  # 2 + 1: the refused not counted


def test_a_waiting_line_gives_its_lowest_score_first_and_a_place_is_kept_on_joining_again(
    store: str,
) -> None:
    counters.line_join("line", "late", score=5, timeout_s=60)
    counters.line_join("line", "early", score=1, timeout_s=60)
    counters.line_join("line", "late", score=0, timeout_s=60)  # in line already: keeps its place
    assert [counters.line_next("line") for _ in range(3)] == [("early", 1), ("late", 5), None]


def test_stamps_are_made_once_renewed_apart_and_never_come_back_after_a_flush(
    store: str,
) -> None:
    first = counters.stamps("rows-a", "rows-b")
    if store == "memory":  # one process's memory tells no other process: nothing is kept
        counters.stamp_renew("rows-a")
        assert first is None and counters.stamps("rows-a") is None
        return
    assert first is not None and first[0] != first[1]
    assert counters.stamps("rows-a", "rows-b") == first
    counters.stamp_renew("rows-a")
    renewed = counters.stamps("rows-a", "rows-b")
    assert renewed is not None and renewed[0] != first[0] and renewed[1] == first[1]
    cache.delete_many(["rows-a", "rows-b"])  # Redis restarted empty, say: what was kept goes
    again = counters.stamps("rows-a", "rows-b")
    assert again is not None and set(again).isdisjoint({*first, *renewed})
