"""How much of the gateway one token may hold: calls in flight, counted where every gateway
process shares them (`counters`).

A call takes a slot when it starts and gives it back on every way out. A slot is counted in
the time bucket it was taken in, and a bucket counts only while a call taken in it could still
be running (the call deadline, GATEWAY_CALL_DEADLINE_S): a slot that is never given back (a
process killed mid-call, a stream its caller never read) drops out by itself instead of
shrinking the token's share for good."""

import logging
import math
import time
from dataclasses import dataclass

from django.conf import settings

from icrlhf.integrations import counters

logger = logging.getLogger(__name__)

BUCKET_S = 30
clock = time.time


@dataclass(frozen=True)
class Slot:
    key: str  # the bucket's counter; empty when the cache was down and nothing was counted


def _buckets_alive() -> int:
    return math.ceil(settings.GATEWAY_CALL_DEADLINE_S / BUCKET_S) + 1


def in_flight_acquire(token_id: int) -> Slot | None:
    """A slot for one call of this token, or None when it already has
    GATEWAY_MAX_IN_FLIGHT_PER_TOKEN calls in flight. With the cache down, calls go on uncounted
    (the per-minute limit is down too; refusing every call would be worse)."""
    bucket = int(clock() // BUCKET_S)
    keys = [f"gateway-in-flight:{token_id}:{bucket - age}" for age in range(_buckets_alive())]
    try:
        # Counted first, then compared: two calls racing for the last slot may both be refused,
        # never both let in.
        in_flight = counters.add(
            keys[0], 1, timeout_s=(_buckets_alive() + 1) * BUCKET_S, plus=keys[1:]
        )
        if in_flight > settings.GATEWAY_MAX_IN_FLIGHT_PER_TOKEN:
            counters.subtract(keys[0], 1)
            return None
    except Exception:
        logger.warning("In-flight limit skipped: the cache is unavailable", exc_info=True)
        return Slot(key="")
    return Slot(key=keys[0])


def in_flight_release(slot: Slot) -> None:
    if not slot.key:
        return
    try:
        counters.subtract(slot.key, 1)  # unless its bucket expired: then it no longer counts
    except Exception:
        logger.warning("In-flight slot not released: the cache is unavailable", exc_info=True)
