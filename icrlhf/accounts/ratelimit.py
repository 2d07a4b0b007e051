"""Fixed-window attempt counters, shared by every web process (`counters`: Redis when CACHE_URL
names it): against password guessing and token guessing."""

import logging
import time

from django.conf import settings
from django.http import HttpRequest

from icrlhf.integrations import counters

WINDOW_S = 60
logger = logging.getLogger(__name__)
# The windows' clock; tests pin it, so that a minute turning over mid-test resets nothing.
clock = time.time


class LimiterUnavailable(RuntimeError):
    """The cache that holds the counters cannot be reached."""


def client_ip(request: HttpRequest) -> str:
    """The client's address: REMOTE_ADDR, or behind TRUSTED_PROXY_COUNT proxies of the
    install's own, the address the outermost of them saw (X-Forwarded-For, read from the
    right: what a client writes into the header itself comes first and is never taken)."""
    proxies = settings.TRUSTED_PROXY_COUNT
    if proxies > 0:
        forwarded = [
            part.strip()
            for part in str(request.META.get("HTTP_X_FORWARDED_FOR", "")).split(",")
            if part.strip()
        ]
        if len(forwarded) >= proxies:
            return forwarded[-proxies]
    return str(request.META.get("REMOTE_ADDR") or "unknown")


def seconds_left_in_window() -> int:
    """For Retry-After: when the current minute's counters start again."""
    return WINDOW_S - int(clock()) % WINDOW_S


def attempt_allowed(
    scope: str, ident: str, *, per_minute: int, cost: int = 1, fail_closed: bool = False
) -> bool:
    """Counts `cost` attempts for (scope, ident); False once more than `per_minute` would
    have been made this minute. A refused attempt is not counted, so a smaller batch may
    still fit. With the cache down: allowed, or with `fail_closed` LimiterUnavailable (logins:
    no unlimited password guessing while Redis is away)."""
    key = f"ratelimit:{scope}:{ident}:{int(clock() // WINDOW_S)}"
    try:
        count = counters.add(key, cost, timeout_s=WINDOW_S + 1)
        if count > per_minute:
            counters.subtract(key, cost)
    except Exception as error:  # the cache's server is down
        if fail_closed:
            raise LimiterUnavailable("The attempt counters are unavailable.") from error
        logger.warning("Rate limiting skipped: the cache is unavailable", exc_info=True)
        return True
    return count <= per_minute
