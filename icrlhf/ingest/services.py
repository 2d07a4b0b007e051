import hashlib
import secrets
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from icrlhf.accounts.ratelimit import attempt_allowed, seconds_left_in_window
from icrlhf.ingest.models import DEFAULT_SCOPES, IntegrationToken
from icrlhf.queues.models import Queue

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


def token_authenticate(*, token: str) -> IntegrationToken | None:
    if not token.startswith(TOKEN_PREFIX) or len(token) > 200:
        return None
    record = (
        IntegrationToken.objects.select_related("queue")
        .filter(token_hash=_digest(token), revoked_at__isnull=True)
        .first()
    )
    now = timezone.now()
    if record is not None and (
        record.last_used_at is None or now - record.last_used_at > _LAST_USED_PRECISION
    ):
        # A write per call would serialise a busy gateway's calls on the database: a minute's
        # precision is what "last used" needs.
        IntegrationToken.objects.filter(pk=record.pk).update(last_used_at=now)
    return record
