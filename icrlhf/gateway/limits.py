"""How much of the gateway one token may hold: calls in flight, counted where every gateway
process shares them (`counters`).

A call takes a slot when it starts and gives it back on every way out; a slot never given back
(a process killed mid-call, a stream its caller never read) drops out once the call deadline
(GATEWAY_CALL_DEADLINE_S) has passed (`counters.slot_take`)."""

import logging
import time

from django.conf import settings

from icrlhf.integrations import counters
from icrlhf.integrations.counters import BUCKET_S, Slot

logger = logging.getLogger(__name__)

__all__ = ["BUCKET_S", "Slot", "in_flight_acquire", "in_flight_release"]
clock = time.time


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
