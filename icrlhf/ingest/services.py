import hashlib
import logging
import pickle
import secrets
import threading
import time
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from icrlhf.accounts.ratelimit import attempt_allowed, seconds_left_in_window
from icrlhf.ingest.models import DEFAULT_SCOPES, IntegrationToken
from icrlhf.integrations import counters
from icrlhf.queues.models import Queue

logger = logging.getLogger(__name__)

TOKEN_PREFIX = "icr_"


class CreationLimitReached(Exception):
    def __init__(self, limit: int, wait: int, noun: str) -> None:
        super().__init__(f"This token may create {limit:,} {noun} a minute; retry in {wait} s.")
        self.wait = wait


def token_creation_check(*, token_id: int, count: int, noun: str = "tickets") -> None:
    """The token's creation limit: items and tickets through the API, and the review items
    its gateway calls are captured into, together (a batch counts each one). One
    integration's flood is refused with a clear 429 (the API) or waits (a capture)."""
    limit = settings.TICKETS_PER_MINUTE_PER_TOKEN
    if not attempt_allowed("api-token-tickets", str(token_id), per_minute=limit, cost=count):
        raise CreationLimitReached(limit, seconds_left_in_window(), noun)


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def token_create(
    *, queue: Queue, name: str, scopes: list[str] | None = None
) -> tuple[IntegrationToken, str]:
    """A new token (scopes: DEFAULT_SCOPES unless given); the plain token is returned once
    and never stored."""
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    record = IntegrationToken.objects.create(
        queue=queue,
        name=name,
        token_hash=_digest(token),
        prefix=token[:12],
        scopes=list(DEFAULT_SCOPES if scopes is None else scopes),
    )
    return record, token


_LAST_USED_PRECISION = timedelta(minutes=1)


# The tokens this process authenticated lately, by digest: the row and its queue's, pickled
# (each call gets instances of its own), with the stamps they were read under and when. Kept
# while both stamps stand: revoking a token or changing it, its queue or any queue renews one
# (`StampedModel`), so the next call reads the rows again. One round trip to Redis instead of
# a query joining two tables, an eighth of a gateway call's CPU. Without Redis nothing is
# kept (no other process could say what changed); a renewal that failed while Redis was
# away is bounded by the age limit.
_KEPT_FOR_S = 60.0
_KEPT_MAX = 1024
_kept: dict[str, tuple[tuple[str, ...], float, bytes]] = {}
_kept_lock = threading.Lock()  # the gateway authenticates on its pool's threads


def token_authenticate(*, token: str) -> IntegrationToken | None:
    if not token.startswith(TOKEN_PREFIX) or len(token) > 200:
        return None
    digest = _digest(token)
    try:
        stamps = counters.stamps(IntegrationToken.rows_stamp, Queue.rows_stamp)
    except Exception:  # the cache's server is down: the database answers alone
        logger.warning("Token rows read without the stamps: the cache is unavailable")
        stamps = None
    kept = _kept.get(digest)
    if (
        stamps is not None
        and kept is not None
        and kept[0] == stamps
        and time.monotonic() - kept[1] < _KEPT_FOR_S
    ):
        return _last_used_noted(
            pickle.loads(kept[2]), digest=digest, stamps=kept[0], read_at=kept[1]
        )
    record = (
        IntegrationToken.objects.select_related("queue")
        .filter(token_hash=digest, revoked_at__isnull=True)
        .first()
    )
    if record is None:
        with _kept_lock:
            _kept.pop(digest, None)
        return None
    read_at = time.monotonic()
    if stamps is not None:
        _keep(digest, record, stamps=stamps, read_at=read_at)
    return _last_used_noted(record, digest=digest, stamps=stamps, read_at=read_at)


def _keep(
    digest: str, record: IntegrationToken, *, stamps: tuple[str, ...], read_at: float
) -> None:
    kept = (stamps, read_at, pickle.dumps(record))
    with _kept_lock:
        if digest not in _kept and len(_kept) >= _KEPT_MAX:
            del _kept[next(iter(_kept))]  # the oldest kept
        _kept[digest] = kept


def _last_used_noted(
    record: IntegrationToken,
    *,
    digest: str,
    stamps: tuple[str, ...] | None,
    read_at: float,
) -> IntegrationToken:
    now = timezone.now()
    if record.last_used_at is None or now - record.last_used_at > _LAST_USED_PRECISION:
        # A write per call would serialise a busy gateway's calls on the database: a minute's
        # precision is what "last used" needs. Through the plain manager: "last used" is not
        # what other processes keep the row for, so it renews no stamp.
        IntegrationToken._base_manager.filter(pk=record.pk).update(last_used_at=now)
        record.last_used_at = now
        if stamps is not None:
            # Kept again under the stamps this row was read under, never the entry's now:
            # another thread may have kept a newer row under newer stamps meanwhile, which
            # this older row must not take the place of (at worst the next call reads again).
            _keep(digest, record, stamps=stamps, read_at=read_at)
    return record
