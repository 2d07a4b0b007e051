"""Review generation's share of an LLM endpoint: at most REVIEW_GENERATION_MAX_CONCURRENT of
review's model calls at once per endpoint (its base URL), across every worker, so that a flood
of review work (a burst of captures) never fills the endpoint the gateway serves applications
from. The gateway takes no slot: its calls always go straight to the endpoint.

One slot is one generation's model call: its candidates asked for together (one request with
`n`, or one each at once where the server ignores `n`), or one candidate's retry.

Counted where every worker shares it (`counters.slot_take`: the cache's Redis, in time
buckets, as the gateway counts calls in flight): a slot its worker never gave back (killed
mid-call) drops out once no call taken with it could still be running.

What finds no free slot joins the endpoint's waiting line (`wait_in_line`), in fair order,
and is woken when a slot is given back (`next_in_line`): waiting costs nothing, where asking
again every quarter second kept a worker busy doing nothing while the model was the
bottleneck."""

import hashlib
import json
import logging
import time
from dataclasses import dataclass

from django.conf import settings

from icrlhf.integrations import counters
from icrlhf.integrations.counters import BUCKET_S, Slot

logger = logging.getLogger(__name__)

__all__ = [
    "BUCKET_S",
    "InLine",
    "Slot",
    "next_in_line",
    "slot_give_back",
    "slot_take",
    "wait_in_line",
]
clock = time.time


def _longest_call_s() -> float:
    # A call, asked again without structured output if the endpoint refused it, each given
    # up on LLM_TIMEOUT_S + 30 s after it started (integrations/llm/).
    return 2 * (settings.LLM_TIMEOUT_S + 30)


def _endpoint(api_base: str) -> str:
    base = (api_base or settings.LLM_API_BASE).rstrip("/")
    return hashlib.sha256(base.encode()).hexdigest()[:16]


def slot_take(*, api_base: str) -> Slot | None:
    """A slot for one review model call to the endpoint at `api_base` (empty: the install's
    LLM_API_BASE), or None when review already has its share of it in flight. With the cache
    down, review goes on uncounted (as the gateway's own limits do)."""
    cap = settings.REVIEW_GENERATION_MAX_CONCURRENT
    if cap <= 0:
        return Slot(key="")
    try:
        return counters.slot_take(
            f"review-share:{_endpoint(api_base)}",
            cap=cap,
            longest_s=_longest_call_s(),
            now=clock(),
        )
    except Exception:
        logger.warning("Review's share of the endpoint not counted: the cache is unavailable")
        return Slot(key="")


def slot_give_back(slot: Slot) -> None:
    try:
        counters.slot_give_back(slot)
    except Exception:
        logger.warning("Review's slot not given back: the cache is unavailable", exc_info=True)


# The score of a place in line: the fair priority first, then the time it joined.
_PRIORITY_WEIGHT = 1e11


def _line(api_base: str) -> str:
    return f"review-line:{_endpoint(api_base)}"


@dataclass(frozen=True)
class InLine:
    """Candidates taken out of the line, and their place in it: should a newcomer take the
    slot before them, they join again there, ahead of all who came after them."""

    candidate_ids: list[int]
    place: float


def wait_in_line(
    *, api_base: str, candidate_ids: list[int], priority: int, place: float | None = None
) -> bool:
    """Puts candidates that found no slot in the endpoint's line, behind those of a better
    (lower) fair priority and those that came before, or back at their `place` (InLine's).
    False when the cache is unavailable: the caller asks again later by itself."""
    try:
        counters.line_join(
            _line(api_base),
            json.dumps(candidate_ids),
            score=priority * _PRIORITY_WEIGHT + clock() if place is None else place,
            timeout_s=int(_longest_call_s()) * 10,
        )
    except Exception:
        logger.warning("Review's waiting line not joined: the cache is unavailable")
        return False
    return True


def next_in_line(*, api_base: str) -> InLine | None:
    """The candidates first in the endpoint's line, taken out of it."""
    try:
        first = counters.line_next(_line(api_base))
    except Exception:
        logger.warning("Review's waiting line not read: the cache is unavailable")
        return None
    if first is None:
        return None
    member, place = first
    return InLine(candidate_ids=json.loads(member), place=place)
