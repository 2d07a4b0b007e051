"""Rows written after the response, handed over through Redis so that none is lost.

A process that has answered puts what the rows are written from into a journal (one round
trip: the entry in a hash under its key, the key at the end of a list) and answers; a writer
thread writes the rows. One writer at a time across every process holds the journal's lock
(redis-py's `Lock`, which expires), so the rows are written in the order their entries were
added: an agent's next call is journaled after its previous one was, and written after it.

An entry leaves the hash only once its row is written. A writer killed mid-write leaves it
there: whoever takes the lock next writes what is left, oldest first, before anything else,
and so does the periodic sweep while no writer holds the lock. Writing must therefore be
idempotent (the entry's key names its row), and a row may be written twice at once only
when a writer stalled past its lock's life.

Without Redis (a cache in the process's memory, as in most tests) there is no journal:
`available()` says so and the caller writes in place. The journal's keys are the cache's
(its KEY_PREFIX keeps installs sharing one Redis apart)."""

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import redis
from django.core.cache import cache
from redis.lock import Lock

from icrlhf.integrations.counters import cache_redis

logger = logging.getLogger(__name__)

# The gateway's call log: each answered call's row and its run's step.
CALLS = "calls"
# How long the writer's lock lives unless renewed: a writer that died is replaced after this.
_LOCK_S = 10.0
# Entries still unwritten this long after they were added are written by the sweep or the
# writer's own catching up (their writer died, or the database refused them).
STALE_S = 30.0
# A journal's keys expire this long after the last entry was added: what tests leave behind
# goes, and an install whose writers were all down this long has lost more than its log.
_KEEP_S = 7 * 24 * 3600
# Keys taken from the list at once.
_BATCH = 100

type Write = Callable[[dict[str, Any]], None]


class JournalUnavailable(RuntimeError):
    """Redis could not be reached: the caller writes in place."""


def _keys(name: str) -> tuple[str, str, str]:
    """The journal's hash of entries, its list of keys in order, and its writer's lock."""
    entries, order, writer = (
        cache.make_and_validate_key(f"journal:{name}:{part}")
        for part in ("entries", "order", "writer")
    )
    return entries, order, writer


def _client() -> redis.Redis:
    client = cache_redis()
    if client is None:
        raise JournalUnavailable("The cache is not Redis: there is no journal.")
    return client


def available() -> bool:
    """Whether there is a journal (the cache is Redis)."""
    return cache_redis() is not None


def add(name: str, key: str, entry: dict[str, Any]) -> None:
    """Hand `entry` (JSON's types) over to the writer, under `key`. Raises
    JournalUnavailable when Redis cannot be reached."""
    entries, order, _ = _keys(name)
    body = json.dumps({"entry": entry, "added": time.time()})
    try:
        with _client().pipeline(transaction=True) as both:
            both.hset(entries, key, body)
            both.rpush(order, key)
            both.expire(entries, _KEEP_S)
            both.expire(order, _KEEP_S)
            both.execute()
    except redis.RedisError as error:
        raise JournalUnavailable(f"The journal could not be reached: {error}") from error


def pending(name: str, key: str) -> bool:
    """Whether the entry under `key` is still waiting to be written."""
    return bool(_still_waiting(name, [key]))


def _still_waiting(name: str, keys: list[str]) -> list[str]:
    """Those of `keys` whose entries are waiting to be written (none without Redis)."""
    if not keys or not available():
        return []
    entries, _, _ = _keys(name)
    try:
        found = _client().hmget(entries, keys)
    except redis.RedisError:
        return []
    return [key for key, entry in zip(keys, found, strict=True) if entry is not None]


def _waited(name: str, keys: list[str], timeout_s: float) -> bool:
    waiting = _still_waiting(name, keys)
    if not waiting:
        return False
    deadline = time.monotonic() + timeout_s
    while waiting and time.monotonic() < deadline:
        time.sleep(0.01)
        waiting = _still_waiting(name, waiting)
    return True


def waited_for(name: str, key: str, *, timeout_s: float) -> bool:
    """If the entry under `key` is waiting to be written, wait (up to `timeout_s`) until it
    is; returns whether it was waiting (a reader that found no row should look again)."""
    return _waited(name, [key], timeout_s)


def waited_for_all(name: str, *, timeout_s: float) -> bool:
    """`waited_for` every entry waiting now (a reader that cannot name the one it needs)."""
    if not available():
        return False
    entries, _, _ = _keys(name)
    try:
        keys = [_text(key) for key in _client().hkeys(entries)]
    except redis.RedisError:
        return False
    return _waited(name, keys, timeout_s)


def _text(key: bytes | str) -> str:
    return key.decode() if isinstance(key, bytes) else key


class Writer:
    """Writes a journal's entries with `write`, while it holds the journal's lock: on a
    thread of its own (`start`), or in one go (`catch_up`, `drain`)."""

    def __init__(self, name: str, write: Write) -> None:
        self.name, self.write = name, write
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock: Lock | None = None
        self._caught_up_at = 0.0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"journal-{self.name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread, then write what is left while holding the lock (a process
        shutting down)."""
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(timeout=_LOCK_S)
        self.drain()

    def _run(self) -> None:
        while not self._stopped.is_set():
            try:
                if not self._hold():
                    self._stopped.wait(1.0)
                    continue
                if time.monotonic() - self._caught_up_at > STALE_S:
                    self.catch_up(older_than_s=STALE_S if self._caught_up_at else 0.0)
                for key in self._taken(wait_s=1.0):
                    self._write_one(key)
            except redis.RedisError as error:
                logger.warning("The %s journal's writer lost Redis: %s", self.name, error)
                self._stopped.wait(1.0)
            except Exception:  # the thread must outlive any one entry
                logger.exception("The %s journal's writer failed; it carries on", self.name)
                self._stopped.wait(1.0)

    def _hold(self) -> bool:
        """Whether this writer holds the lock now (taken, or its life renewed)."""
        if self._lock is not None and self._lock.owned():
            self._lock.reacquire()
            return True
        _, _, writer = _keys(self.name)
        # Not thread-local: `stop` releases, from another thread, what the writer's took.
        self._lock = _client().lock(writer, timeout=_LOCK_S, thread_local=False)
        if self._lock.acquire(blocking=False):
            self._caught_up_at = 0.0  # a writer before this one may have died mid-write
            return True
        return False

    def _taken(self, *, wait_s: float) -> list[str]:
        """The next keys in order: waits up to `wait_s` for the first."""
        _, order, _ = _keys(self.name)
        client = _client()
        first = client.blpop([order], timeout=wait_s) if wait_s else None
        rest: list[bytes | str] = client.lpop(order, _BATCH) or []  # type: ignore[assignment]
        keys = [first[1], *rest] if first else rest
        return [_text(key) for key in keys]

    def _write_one(self, key: str) -> bool:
        """Whether this wrote the entry under `key` (not written before, nor left for later)."""
        entries, _, _ = _keys(self.name)
        client = _client()
        raw = client.hget(entries, key)
        if raw is None:  # written already (catching up wrote it before its turn came)
            return False
        try:
            self.write(json.loads(raw)["entry"])
        except Exception:
            # Left in the hash: written by the next catching up, once the cause has passed.
            logger.exception("A %s journal entry (%s) could not be written yet", self.name, key)
            return False
        client.hdel(entries, key)
        return True

    def catch_up(self, *, older_than_s: float = 0.0) -> int:
        """Write the entries added more than `older_than_s` ago, oldest first; returns how
        many were written (one that fails stays for the next time). The caller holds the
        lock (or knows nobody does)."""
        entries, _, _ = _keys(self.name)
        now = time.time()
        waiting = sorted(
            (json.loads(raw)["added"], _text(key))
            for key, raw in _client().hgetall(entries).items()
        )
        stale = [key for added, key in waiting if now - added >= older_than_s]
        written = sum(self._write_one(key) for key in stale)
        self._caught_up_at = time.monotonic()
        return written

    def drain(self) -> int:
        """Write everything waiting, if this writer holds the lock or can take it; then let
        it go. Returns how many entries were written."""
        try:
            if not self._hold():
                return 0  # another process's writer holds it: it writes them
            written = self.catch_up()
            self._caught_up_at = 0.0
            assert self._lock is not None
            self._lock.release()
            return written
        except (redis.RedisError, JournalUnavailable) as error:
            logger.warning("The %s journal could not be drained: %s", self.name, error)
            return 0


def sweep(name: str, write: Write) -> int:
    """Write the entries no writer is writing: while nobody holds the lock (every process
    that wrote the journal is gone), all of them. Returns how many were written."""
    if not available():
        return 0
    return Writer(name, write).drain()
