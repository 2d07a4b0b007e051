"""Counters that every process shares, for the limits (logins, API and gateway calls, calls in
flight): in Redis when Django's cache is Redis, else in the cache itself (one process's
memory, as in the tests).

In Redis each operation is one Lua script, one round trip, atomic. Through Django's cache API a
count took three round trips (`add`; `incr`, which asks `EXISTS` first) and a gateway call's
limits nine: at 32 calls at once on two cores they were a third of the gateway's handling time
(py-spy). Keys and values are Django's own (`make_and_validate_key`, integers stored as
integers), so `cache.get` reads them either way.

Every function raises when the cache's server cannot be reached: the caller decides whether
that opens or closes its limit."""

import math
import threading
import uuid
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass
from functools import cache as memoized

import redis
from django.conf import settings
from django.core.cache import cache
from redis.commands.core import Script

_REDIS_CACHE = "django.core.cache.backends.redis.RedisCache"

# KEYS[1] is created at 0 with a time to live if missing, then raised by ARGV[1]; returns it
# plus the values of the other KEYS (older buckets of the same count; missing ones are 0).
_ADD = """
redis.call('SET', KEYS[1], 0, 'EX', ARGV[2], 'NX')
local total = redis.call('INCRBY', KEYS[1], ARGV[1])
for i = 2, #KEYS do
    total = total + (tonumber(redis.call('GET', KEYS[i])) or 0)
end
return total
"""
# Lowered only while it exists: an expired count is not brought back below zero, untimed.
_SUBTRACT = """
if redis.call('EXISTS', KEYS[1]) == 1 then
    return redis.call('DECRBY', KEYS[1], ARGV[1])
end
return false
"""


@memoized
def _client(location: str) -> redis.Redis:
    return redis.Redis.from_url(location)


@memoized
def _scripts(location: str) -> tuple[Script, Script]:
    client = _client(location)
    return client.register_script(_ADD), client.register_script(_SUBTRACT)


def _redis_location() -> str | None:
    """The cache's Redis, or None when the cache is not Redis. Read from the settings on
    every call: tests change them."""
    configured = settings.CACHES["default"]
    if configured["BACKEND"] != _REDIS_CACHE:
        return None
    location = configured["LOCATION"]
    return location if isinstance(location, str) else location[0]


def cache_redis() -> redis.Redis | None:
    """A client of the cache's Redis (shared by the process's threads), or None when the
    cache is not Redis."""
    location = _redis_location()
    return None if location is None else _client(location)


def _redis_scripts() -> tuple[Script, Script] | None:
    location = _redis_location()
    return None if location is None else _scripts(location)


def add(key: str, amount: int, *, timeout_s: int, plus: Sequence[str] = ()) -> int:
    """Adds `amount` to the count at `key` (created at 0, living `timeout_s`, if missing) and
    returns it, plus the counts at `plus` (counted as 0 where missing)."""
    scripts = _redis_scripts()
    if scripts is not None:
        keys = [cache.make_and_validate_key(name) for name in (key, *plus)]
        return int(scripts[0](keys=keys, args=[amount, timeout_s]))
    cache.add(key, 0, timeout=timeout_s)
    try:
        total = cache.incr(key, amount)
    except ValueError:  # expired between the two
        cache.set(key, amount, timeout=timeout_s)
        total = amount
    return total + sum(int(count) for count in cache.get_many(list(plus)).values())


def subtract(key: str, amount: int) -> None:
    """Takes `amount` back from the count at `key`, if it still exists."""
    scripts = _redis_scripts()
    if scripts is not None:
        scripts[1](keys=[cache.make_and_validate_key(key)], args=[amount])
        return
    with suppress(ValueError):  # expired: nothing left to take back
        cache.decr(key, amount)


# Slots (calls in flight): counted in the time bucket they were taken in, and a bucket counts
# only while a call taken in it could still be running, so that a slot never given back (a
# process killed mid-call) drops out by itself instead of shrinking the share for good.
BUCKET_S = 30


@dataclass(frozen=True)
class Slot:
    key: str  # the bucket's counter; empty when nothing was counted (no cap, or no cache)


def slot_take(name: str, *, cap: int, longest_s: float, now: float) -> Slot | None:
    """A slot of `name`'s `cap`, or None when all are taken; a call that holds it ends within
    `longest_s`. Raises when the cache's server cannot be reached."""
    alive = math.ceil(longest_s / BUCKET_S) + 1
    bucket = int(now // BUCKET_S)
    keys = [f"{name}:{bucket - age}" for age in range(alive)]
    # Counted first, then compared: two calls racing for the last slot may both be refused,
    # never both let in.
    in_flight = add(keys[0], 1, timeout_s=(alive + 1) * BUCKET_S, plus=keys[1:])
    if in_flight > cap:
        subtract(keys[0], 1)
        return None
    return Slot(key=keys[0])


def slot_give_back(slot: Slot) -> None:
    """Raises when the cache's server cannot be reached."""
    if slot.key:
        subtract(slot.key, 1)  # unless its bucket expired: then it no longer counts


# Waiting lines: members (strings) waiting for a slot, taken lowest score first; a member
# already in line keeps its place when it joins again. In Redis a sorted set; without Redis,
# a dict in the cache (one process's memory: the tests), read and written whole under a lock.
_lines_lock = threading.Lock()


def line_join(name: str, member: str, *, score: float, timeout_s: int) -> None:
    """Puts `member` in `name`'s line at `score`, unless it is in line already; the line
    lives `timeout_s` from its latest join. Raises when the cache's server cannot be
    reached."""
    client = cache_redis()
    key = cache.make_and_validate_key(name)
    if client is not None:
        with client.pipeline() as joining:
            joining.zadd(key, {member: score}, nx=True)
            joining.expire(key, timeout_s)
            joining.execute()
        return
    with _lines_lock:
        line = cache.get(name) or {}
        cache.set(name, {member: score, **line}, timeout=timeout_s)


def line_next(name: str) -> tuple[str, float] | None:
    """Takes the member with the lowest score out of `name`'s line, with its score (None:
    nobody waits). Raises when the cache's server cannot be reached."""
    client = cache_redis()
    if client is not None:
        taken: list[tuple[bytes, float]] = client.zpopmin(  # type: ignore[assignment]
            cache.make_and_validate_key(name), 1
        )
        return (taken[0][0].decode(), float(taken[0][1])) if taken else None
    with _lines_lock:
        line = dict(cache.get(name) or {})
        if not line:
            return None
        first: str = min(line, key=line.__getitem__)
        score = float(line.pop(first))
        cache.set(name, line)
        return first, score


# Stamps: values every process reads to tell whether what it keeps in memory is still
# current. Renewing one (a new random value, not a count: a Redis restarted empty never
# brings an old value back) makes every process read afresh. Only in Redis: a cache in one
# process's memory would tell no other process of a change.


def stamps(*names: str) -> tuple[str, ...] | None:
    """The stamps `names`, each made if missing, in one round trip; None without Redis (keep
    nothing then). Raises when the cache's server cannot be reached."""
    client = cache_redis()
    if client is None:
        return None
    keys = [cache.make_and_validate_key(name) for name in names]
    current: list[bytes | None] = client.mget(keys)  # type: ignore[assignment]
    if all(value is not None for value in current):
        return tuple(value.decode() for value in current if value is not None)
    with client.pipeline() as making:
        for key in keys:
            making.set(key, uuid.uuid4().hex, nx=True)
        making.mget(keys)
        made: list[bytes] = making.execute()[-1]
    return tuple(value.decode() for value in made)


def stamp_renew(name: str) -> None:
    """Gives `name` a new stamp (nothing without Redis). Raises when the cache's server
    cannot be reached."""
    client = cache_redis()
    if client is not None:
        client.set(cache.make_and_validate_key(name), uuid.uuid4().hex)
