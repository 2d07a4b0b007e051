"""How much of the gateway one token may hold: calls a minute (`calls_limit`, counted by
`ingest.auth`), calls in flight, counted where every gateway process shares them
(`counters`).

A call takes a slot when it starts and gives it back on every way out; a slot never given back
(a process killed mid-call, a stream its caller never read) drops out once the call deadline
(GATEWAY_CALL_DEADLINE_S) has passed (`counters.slot_take`)."""

import logging
import time

from django.conf import settings

from icrlhf.ingest.auth import TokenLimit, token_charge
from icrlhf.integrations import counters
from icrlhf.integrations.counters import BUCKET_S, Slot

logger = logging.getLogger(__name__)

__all__ = [
    "BUCKET_S",
    "Slot",
    "calls_limit",
    "in_flight_acquire",
    "in_flight_release",
    "retry_charge",
]
clock = time.time


def calls_limit() -> TokenLimit:
    """The calls a token may make a minute at the gateway, each a call to the upstream."""
    return TokenLimit("gateway-token", settings.GATEWAY_REQUESTS_PER_MINUTE)


def retry_charge(token_id: int) -> bool:
    """Counts an upstream call the gateway makes again for a call (a tool call it was not
    offered) against the token's calls a minute: each is a call to the upstream, and a
    caller must not get two for the price of one. False when the token has none left this
    minute. Calls in flight need no count: the retry runs inside its call, on its slot."""
    return token_charge(token_id=token_id, limit=calls_limit())


def in_flight_acquire(token_id: int) -> Slot | None:
    """A slot for one call of this token, or None when it already has
    GATEWAY_MAX_IN_FLIGHT_PER_TOKEN calls in flight. With the cache down, calls go on uncounted
    (the per-minute limit is down too; refusing every call would be worse)."""
    try:
        return counters.slot_take(
            f"gateway-in-flight:{token_id}",
            cap=settings.GATEWAY_MAX_IN_FLIGHT_PER_TOKEN,
            longest_s=settings.GATEWAY_CALL_DEADLINE_S,
            now=clock(),
        )
    except Exception:
        logger.warning("In-flight limit skipped: the cache is unavailable", exc_info=True)
        return Slot(key="")


def in_flight_release(slot: Slot) -> None:
    try:
        counters.slot_give_back(slot)
    except Exception:
        logger.warning("In-flight slot not released: the cache is unavailable", exc_info=True)
