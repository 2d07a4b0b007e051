"""Rows written after the response, handed over through Redis so that none is lost.

A process that has answered puts what the rows are written from into a journal (one round
trip: the entry in a hash under its key, the key at the end of a list, the key in its owner's
index) and answers; a writer thread writes the rows. One writer at a time across every
process holds the journal's lock (redis-py's `Lock`, which expires; a thread of the writer's
renews it while it makes progress), so the rows are written in the order their entries were
added: an agent's next call is journaled after its previous one was, and written after it.

Each entry names its run (`Run`). An entry that cannot be written yet holds back its run's
later entries, and only those: the next catching up writes them all, in order. One the
database keeps refusing (`TRIES` times; a failure the caller calls transient, such as the
database being down, is not counted) is set aside as a dead letter, which lets its run go on.
Dead letters are few (`DEAD_MAX`, the newest), counted (`counts`), and, like the entries, gone
once older than the journal's keep time (its caller's retention): catching up purges them.
An operator, once the cause is fixed, writes them again (`dead_letters_retry`) or drops them
(`dead_letters_discard`); each letter is removed or replaced on its own, atomically, so that
neither runs over a writer setting a new one aside meanwhile.

An entry leaves the hash only once its row is written. A writer killed mid-write leaves it
there: whoever takes the lock next writes what is left, oldest first, before anything else,
and so does the periodic sweep while no writer holds the lock. Writing must therefore be
idempotent (the entry's key names its row), and a row may be written twice at once only
when a writer stalled past its lock's life (hung in a write for `_STALL_S`, or its whole
process frozen).

Without Redis (a cache in the process's memory, as in most tests) there is no journal:
`available()` says so and the caller writes in place. The journal's keys are the cache's
(its KEY_PREFIX keeps installs sharing one Redis apart)."""

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass
from typing import Any

import redis
from django.core.cache import cache
from redis.exceptions import LockError
from redis.lock import Lock

from icrlhf.integrations.counters import cache_redis

logger = logging.getLogger(__name__)

# The gateway's call log: each answered call's row and its run's step.
CALLS = "calls"
# How long the writer's lock lives unless renewed: a writer that died is replaced after this.
_LOCK_S = 10.0
# A write still running after this long is taken for hung: its lock is no longer renewed, and
# the next writer takes over (writing its entry again, which writing allows).
_STALL_S = 120.0
# How often a writer catches up (writes what its stream left behind, purges what is too old).
STALE_S = 30.0
# The longest anything stays in a journal, whatever its caller keeps (an install whose
# writers were all down this long has lost more than its log).
KEEP_S = 7 * 24 * 3600.0
# Failed tries after which an entry is set aside as a dead letter.
TRIES = 5
# Dead letters kept, the newest.
DEAD_MAX = 1000
# Keys taken from the list at once.
_BATCH = 100

type Write = Callable[[dict[str, Any]], None]

# Counts a try in an entry's body, unless the entry left meanwhile (written by a writer whose
# lock had lapsed): it is not brought back.
_TRIED = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then
    redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
end
"""

# Replaces a dead letter by its new version (tried again), unless it left meanwhile
# (discarded, purged, written by another retry): it is not brought back.
_LETTER_REPLACED = """
local at = redis.call('LPOS', KEYS[1], ARGV[1])
if at then
    redis.call('LSET', KEYS[1], at, ARGV[2])
end
"""


class JournalUnavailable(RuntimeError):
    """Redis could not be reached: the caller writes in place."""


@dataclass(frozen=True)
class Run:
    """The run an entry belongs to: a run's entries are written in the order they were
    added, and its owner's readers may wait for them. An unnamed run (key "") is found from
    its messages only when written: it stands for all the owner's and end user's unnamed
    entries."""

    owner: str  # whose readers may wait for its entries (a token's id)
    end_user: str
    key: str

    @property
    def id(self) -> str:
        return json.dumps([self.owner, self.end_user, self.key])


@dataclass(frozen=True)
class Counts:
    waiting: int
    dead_letters: int


@dataclass(frozen=True)
class Retried:
    """What writing the dead letters again did: how many were written and left, how many
    failed again and stay (with their new error), how many were past the keep time and
    left unwritten."""

    written: int
    kept: int
    expired: int


def _key(name: str, part: str) -> str:
    return cache.make_and_validate_key(f"journal:{name}:{part}")


def _keys(name: str) -> tuple[str, str, str]:
    """The journal's hash of entries, its list of keys in order, and its writer's lock."""
    return _key(name, "entries"), _key(name, "order"), _key(name, "writer")


def _owned_key(name: str, owner: str) -> str:
    """The owner's index: the key of each of its entries still waiting, and its run's key."""
    return _key(name, f"owner:{owner}")


def _dead_key(name: str) -> str:
    return _key(name, "dead")


def _client() -> redis.Redis:
    client = cache_redis()
    if client is None:
        raise JournalUnavailable("The cache is not Redis: there is no journal.")
    return client


def available() -> bool:
    """Whether there is a journal (the cache is Redis)."""
    return cache_redis() is not None


def add(name: str, key: str, entry: dict[str, Any], *, run: Run, keep_s: float = KEEP_S) -> None:
    """Hand `entry` (JSON's types) of `run` over to the writer, under `key`. Raises
    JournalUnavailable when Redis cannot be reached."""
    entries, order, _ = _keys(name)
    owned = _owned_key(name, run.owner)
    body = json.dumps({"entry": entry, "added": time.time(), "run": asdict(run)})
    try:
        with _client().pipeline(transaction=True) as together:
            together.hset(entries, key, body)
            together.rpush(order, key)
            together.hset(owned, key, run.key)
            # A key of an install whose writers are all gone leaves after `keep_s` (catching
            # up purges each entry by its own age).
            for each in (entries, order, owned):
                together.expire(each, int(keep_s))
            together.execute()
    except redis.RedisError as error:
        raise JournalUnavailable(f"The journal could not be reached: {error}") from error


def pending(name: str, key: str) -> bool:
    """Whether the entry under `key` is still waiting to be written."""
    return bool(_still_waiting(name, [key]))


def counts(name: str) -> Counts:
    """How many entries wait to be written, and how many were set aside as dead letters.
    Raises JournalUnavailable when there is no journal or Redis cannot be reached."""
    entries, _, _ = _keys(name)
    try:
        with _client().pipeline(transaction=False) as both:
            both.hlen(entries)
            both.llen(_dead_key(name))
            waiting, dead = both.execute()
    except redis.RedisError as error:
        raise JournalUnavailable(f"The journal could not be reached: {error}") from error
    return Counts(waiting=int(waiting), dead_letters=int(dead))


def dead_letters(name: str) -> list[dict[str, Any]]:
    """The dead letters, newest first: each entry's key, entry, when it was added and last
    failed (Unix time), how many times it failed (`tries`; a letter set aside before they
    were counted has none), and the error it last failed with."""
    with _reached():
        return [json.loads(letter) for letter in _letters(name)]


@contextmanager
def _reached() -> Iterator[None]:
    """Redis failing within is JournalUnavailable to the caller."""
    try:
        yield
    except redis.RedisError as error:
        raise JournalUnavailable(f"The journal could not be reached: {error}") from error


def _letters(name: str) -> list[str]:
    """The dead letters as stored: a letter is removed or replaced by its exact text."""
    letters: list[bytes] = _client().lrange(_dead_key(name), 0, -1)  # type: ignore[assignment]
    return [_text(letter) for letter in letters]


def dead_letters_retry(name: str, write: Write, *, keep_s: float = KEEP_S) -> Retried:
    """Write each dead letter's entry again with `write`, oldest first: one written leaves,
    one that fails again stays, with its new error and one more try; one older than
    `keep_s` leaves unwritten (what end users wrote is kept no longer). Writing must be
    idempotent, as for the writer: two retries at once may write a letter twice. Raises
    JournalUnavailable when Redis cannot be reached (what was written is written again by
    the next retry)."""
    with _reached():
        return _dead_letters_retried(name, write, keep_s=keep_s)


def _dead_letters_retried(name: str, write: Write, *, keep_s: float) -> Retried:
    dead = _dead_key(name)
    client = _client()
    written = kept = expired = 0
    now = time.time()
    for raw in reversed(_letters(name)):
        letter = json.loads(raw)
        if now - letter["added"] > min(keep_s, KEEP_S):
            expired += int(client.lrem(dead, 1, raw))
            continue
        try:
            write(letter["entry"])
        except Exception as error:
            # Its first line only: a database's later lines may quote the row (what the end
            # user wrote), and an operator's terminal is no place for it.
            logger.warning(
                "A %s dead letter (%s) failed again: %s",
                name,
                letter["key"],
                error_line(_error_text(error)),
            )
            again = {
                **letter,
                "tries": int(letter.get("tries", TRIES)) + 1,
                "failed_at": time.time(),
                "error": _error_text(error),
            }
            client.register_script(_LETTER_REPLACED)(keys=[dead], args=[raw, json.dumps(again)])
            kept += 1
            continue
        client.lrem(dead, 1, raw)
        written += 1
    return Retried(written=written, kept=kept, expired=expired)


def dead_letters_discard(name: str) -> int:
    """Remove the dead letters there are now (one set aside meanwhile stays); returns how
    many were removed. Raises JournalUnavailable when Redis cannot be reached."""
    dead = _dead_key(name)
    with _reached():
        letters = _letters(name)
        if not letters:
            return 0
        with _client().pipeline(transaction=True) as together:
            for raw in letters:
                together.lrem(dead, 1, raw)
            removed: list[int] = together.execute()
    return sum(removed)


def _error_text(error: Exception) -> str:
    return f"{type(error).__name__}: {error}"[:2000]


# Characters of an error's first line shown to an operator.
ERROR_LINE_MAX = 200


def error_line(error: str) -> str:
    """A dead letter's error as an operator is shown it: its first line, shortened (a
    database's later lines, DETAIL or CONTEXT, may quote the row it refused)."""
    return (error.splitlines() or [""])[0][:ERROR_LINE_MAX]


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


def waited_for(name: str, key: str, *, timeout_s: float, owner: str | None = None) -> bool:
    """If the entry under `key` is waiting to be written (and, given an `owner`, is one of its
    entries), wait (up to `timeout_s`) until it is; returns whether it was waiting (a reader
    that found no row should look again)."""
    if owner is not None and not _owned(name, owner, key=key):
        return False
    return _waited(name, [key], timeout_s)


def waited_for_run(name: str, *, owner: str, run_key: str, timeout_s: float) -> bool:
    """`waited_for` each of the owner's entries of runs named `run_key`; an unnamed run
    cannot be named, and nothing is waited for."""
    keys = [key for key, its_run in _owned(name, owner).items() if run_key and its_run == run_key]
    return _waited(name, keys, timeout_s)


def _owned(name: str, owner: str, *, key: str | None = None) -> dict[str, str]:
    """The owner's waiting entries (only `key`'s, if given): each one's run key."""
    if not available():
        return {}
    owned = _owned_key(name, owner)
    try:
        if key is not None:
            run_key = _client().hget(owned, key)
            return {} if run_key is None else {key: _text(run_key)}
        return {_text(k): _text(v) for k, v in _client().hgetall(owned).items()}
    except redis.RedisError:
        return {}


def waited_for_all(name: str, *, timeout_s: float) -> bool:
    """`waited_for` every entry waiting now (tooling that waits for the whole log: the
    benchmarks)."""
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


def _run_of(key: str, body: dict[str, Any]) -> Run:
    """The entry's run; an entry journaled before runs were is a run of its own."""
    if "run" not in body:
        return Run(owner="", end_user="", key=f"entry:{key}")
    return Run(**body["run"])


class _Held:
    """The journal's lock while a writer holds it: renewed by a thread of its own every
    quarter of its life, so neither a long batch nor one slow write loses it, as long as the
    writer makes progress (a write hung for `_STALL_S` lets it lapse)."""

    def __init__(self, lock: Lock, name: str) -> None:
        self.lock = lock
        self.lost = False
        self._life_s = float(lock.timeout or _LOCK_S)
        self._renewed_at = self._progress_at = time.monotonic()
        self._released = threading.Event()
        keeper = threading.Thread(target=self._keep, name=f"journal-{name}-lock", daemon=True)
        keeper.start()

    def _keep(self) -> None:
        while not self._released.wait(self._life_s / 4) and not self.lost:
            if time.monotonic() - self._progress_at < _STALL_S:
                self._renew()

    def _renew(self) -> None:
        try:
            self.lock.reacquire()
            self._renewed_at = time.monotonic()
        except LockError:  # it lapsed, and another writer may hold it now
            self.lost = True
        except redis.RedisError as error:
            logger.warning("The journal's lock could not be renewed: %s", error)

    def still_held(self) -> bool:
        """Between entries: whether the lock is still this writer's (renewed now unless the
        keeper did so lately: after a write longer than the lock's life, it may have lapsed)."""
        self._progress_at = time.monotonic()
        if not self.lost and time.monotonic() - self._renewed_at > self._life_s / 2:
            self._renew()
        return not self.lost

    def release(self) -> None:
        self._released.set()
        with suppress(LockError):  # it lapsed: nothing to give back
            self.lock.release()


class Writer:
    """Writes a journal's entries with `write`, while it holds the journal's lock: on a
    thread of its own (`start`), or in one go (`catch_up`, `drain`). Entries and dead letters
    older than `keep_s` are purged as it catches up. A `write` failing with one of the
    `transient` errors leaves its entry for later without counting a try."""

    def __init__(
        self,
        name: str,
        write: Write,
        *,
        keep_s: float = KEEP_S,
        transient: tuple[type[Exception], ...] = (),
    ) -> None:
        self.name, self.write = name, write
        self.keep_s, self.transient = min(keep_s, KEEP_S), transient
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._held: _Held | None = None
        self._caught_up_at = 0.0
        # Runs with an entry left unwritten: their later entries wait for the next catching up.
        self._blocked: set[str] = set()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"journal-{self.name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread, then write what is left while holding the lock (a process
        shutting down)."""
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(timeout=_LOCK_S)
            if self._thread.is_alive():
                # Still in a slow write: draining beside it could write a run's later entry
                # first. Its lock lapses with the process; the next writer or the sweep writes
                # what is left.
                logger.warning("The %s journal's writer is still writing; left", self.name)
                return
        self.drain()

    def _run(self) -> None:
        while not self._stopped.is_set():
            try:
                if not self._hold():
                    self._stopped.wait(1.0)
                    continue
                if time.monotonic() - self._caught_up_at > STALE_S:
                    self.catch_up()
                for key in self._taken(wait_s=1.0):
                    # Lost: what was taken stays in the hash, for the next holder to write.
                    if not self._still_held():
                        break
                    self._write_one(key)
            except redis.RedisError as error:
                logger.warning("The %s journal's writer lost Redis: %s", self.name, error)
                self._stopped.wait(1.0)
            except Exception:  # the thread must outlive any one entry
                logger.exception("The %s journal's writer failed; it carries on", self.name)
                self._stopped.wait(1.0)

    def _hold(self) -> bool:
        """Whether this writer holds the lock now (taken now, or still held)."""
        if self._held is not None and self._held.still_held():
            return True
        _, _, writer = _keys(self.name)
        # Not thread-local: `stop` releases, from another thread, what the writer's took.
        lock = _client().lock(writer, timeout=_LOCK_S, thread_local=False)
        if not lock.acquire(blocking=False):
            self._held = None
            return False
        self._held = _Held(lock, self.name)
        self._caught_up_at = 0.0  # a writer before this one may have died mid-write
        return True

    def _release(self) -> None:
        held, self._held = self._held, None
        self._caught_up_at = 0.0
        if held is not None:
            held.release()

    def _still_held(self) -> bool:
        return self._held is not None and self._held.still_held()

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
        raw = _client().hget(entries, key)
        if raw is None:  # written already (catching up wrote it before its turn came)
            return False
        return self._attempt(key, json.loads(raw))

    def _attempt(self, key: str, body: dict[str, Any]) -> bool:
        """Write the entry unless an earlier one of its run is left unwritten; a failure
        leaves it (and holds back its run), or sets it aside once it failed `TRIES` times."""
        run = _run_of(key, body)
        if run.id in self._blocked:
            return False
        try:
            self.write(body["entry"])
        except self.transient as error:
            shown = error_line(_error_text(error))
            logger.warning("A %s journal entry (%s) waits: %s", self.name, key, shown)
            self._blocked.add(run.id)
            return False
        except Exception as error:
            tries = int(body.get("tries", 0)) + 1
            # The error's first line only, without its traceback: a database's later lines
            # (DETAIL, CONTEXT) may quote the row it refused, end users' words.
            shown = error_line(_error_text(error))
            if tries >= TRIES:
                logger.error("A %s journal entry (%s) is a dead letter: %s", self.name, key, shown)
                self._dead_letter(key, body, run, error, tries=tries)
            else:
                logger.warning("A %s journal entry (%s) failed: %s", self.name, key, shown)
                self._tried(key, {**body, "tries": tries})
                self._blocked.add(run.id)
            return False
        self._remove(key, run)
        return True

    def _remove(self, key: str, run: Run) -> None:
        entries, _, _ = _keys(self.name)
        with _client().pipeline(transaction=True) as together:
            together.hdel(entries, key)
            together.hdel(_owned_key(self.name, run.owner), key)
            together.execute()

    def _tried(self, key: str, body: dict[str, Any]) -> None:
        entries, _, _ = _keys(self.name)
        client = _client()
        client.register_script(_TRIED)(keys=[entries], args=[key, json.dumps(body)])

    def _dead_letter(
        self, key: str, body: dict[str, Any], run: Run, error: Exception, *, tries: int
    ) -> None:
        entries, _, _ = _keys(self.name)
        dead = _dead_key(self.name)
        letter = {
            "key": key,
            "entry": body["entry"],
            "added": body["added"],
            "failed_at": time.time(),
            "tries": tries,
            "error": _error_text(error),
        }
        with _client().pipeline(transaction=True) as together:
            together.hdel(entries, key)
            together.hdel(_owned_key(self.name, run.owner), key)
            together.lpush(dead, json.dumps(letter))
            together.ltrim(dead, 0, DEAD_MAX - 1)
            together.expire(dead, int(self.keep_s))
            together.execute()

    def catch_up(self) -> int:
        """Write every entry waiting, oldest first and each run's in order (an entry that
        fails holds back its run's later ones until the next time; a dead letter lets them
        go); purge the entries and dead letters older than `keep_s`. Returns how many were
        written. The caller holds the lock (or knows nobody does)."""
        entries, _, _ = _keys(self.name)
        now = time.time()
        waiting = sorted(
            (body["added"], _text(key), body)
            for key, raw in _client().hgetall(entries).items()
            for body in [json.loads(raw)]
        )
        self._blocked = set()
        written = 0
        for added, key, body in waiting:
            if now - added > self.keep_s:
                logger.error("A %s journal entry (%s) was too old to write", self.name, key)
                self._remove(key, _run_of(key, body))
            elif self._held is None or self._still_held():
                written += self._attempt(key, body)
            else:
                break  # lost the lock: the next holder writes the rest
        self._dead_letters_purge(now)
        self._caught_up_at = time.monotonic()
        return written

    def _dead_letters_purge(self, now: float) -> None:
        # Each by its own text: rewriting the list would bring back a letter an operator's
        # retry or discard removed meanwhile (the command holds no lock: the gateway's
        # writer always does).
        dead = _dead_key(self.name)
        expired = [
            letter
            for letter in _letters(self.name)
            if now - json.loads(letter)["added"] > self.keep_s
        ]
        if not expired:
            return
        with _client().pipeline(transaction=True) as together:
            for letter in expired:
                together.lrem(dead, 1, letter)
            together.execute()

    def drain(self) -> int:
        """Write everything waiting, if this writer holds the lock or can take it; then let
        it go. Returns how many entries were written."""
        try:
            if not self._hold():
                return 0  # another process's writer holds it: it writes them
            try:
                return self.catch_up()
            finally:
                self._release()
        except (redis.RedisError, JournalUnavailable) as error:
            logger.warning("The %s journal could not be drained: %s", self.name, error)
            return 0


def sweep(
    name: str,
    write: Write,
    *,
    keep_s: float = KEEP_S,
    transient: tuple[type[Exception], ...] = (),
) -> int:
    """Write the entries no writer is writing: while nobody holds the lock (every process
    that wrote the journal is gone), all of them; and purge what is older than `keep_s`.
    Returns how many were written."""
    if not available():
        return 0
    return Writer(name, write, keep_s=keep_s, transient=transient).drain()
