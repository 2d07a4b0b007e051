"""Fixed-window attempt counters in Django's cache (Redis when CACHE_URL names it, so every
web process shares them): against password guessing and token guessing."""

import logging
import time

from django.core.cache import cache
from django.http import HttpRequest

WINDOW_S = 60
logger = logging.getLogger(__name__)
# The windows' clock; tests pin it, so that a minute turning over mid-test resets nothing.
clock = time.time


def client_ip(request: HttpRequest) -> str:
    """REMOTE_ADDR: behind a proxy, configure it to set that (X-Forwarded-For is forgeable)."""
    return str(request.META.get("REMOTE_ADDR") or "unknown")


def seconds_left_in_window() -> int:
    """For Retry-After: when the current minute's counters start again."""
    return WINDOW_S - int(clock()) % WINDOW_S


def attempt_allowed(scope: str, ident: str, *, per_minute: int, cost: int = 1) -> bool:
    """Counts `cost` attempts for (scope, ident); False once more than `per_minute` would
    have been made this minute. A refused attempt is not counted, so a smaller batch may
    still fit."""
    key = f"ratelimit:{scope}:{ident}:{int(clock() // WINDOW_S)}"
    try:
        cache.add(key, 0, timeout=WINDOW_S + 1)
        try:
            count = cache.incr(key, cost)
        except ValueError:  # evicted between add and incr
            cache.set(key, cost, timeout=WINDOW_S + 1)
            count = cost
        if count > per_minute:
            cache.decr(key, cost)
    except Exception:  # the cache's server is down: let people in rather than lock all out
        logger.warning("Rate limiting skipped: the cache is unavailable", exc_info=True)
        return True
    return count <= per_minute
