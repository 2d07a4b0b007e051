"""How long the model takes to answer a queue's gateway calls now, read from the queue's
latest calls in the log, so that a call that cannot be answered before its deadline is
refused at once (503 with Retry-After) instead of failing after the wait.

A call's time is its wait for a free slot on the model's server, then the model reading the
prompt and writing the answer. llama.cpp reports the last two beside each answer (the log
keeps them); the wait is the rest of the upstream's time. A call lost to the deadline
(`504`) reports nothing, but says more: it waited longer than any answered call. So the
queue's calls of the last PACE_WINDOW_S tell the model's pace under its load now: their
median wait, a lost call counting as longer than any, and the seconds a prompt token and an
answer token took in the answered ones with the server's times. Where the server reports no
times (a stream's row never has them), a call's whole upstream time stands for its wait.
Fewer than _FEWEST calls (an idle model) give no estimate, and every call goes ahead: a
refusal needs evidence. Refused calls are not counted: while calls are refused, the
evidence ages out of the window, and calls go ahead again.

A queue's own calls, not the model's across queues: what one queue's members see of the
pace (the calls page) never tells them of another queue's traffic."""

import logging
import math
import statistics
import threading
import time
from dataclasses import dataclass
from datetime import timedelta

from django.db import DatabaseError
from django.utils import timezone

from icrlhf.gateway.models import Call

logger = logging.getLogger(__name__)

PACE_WINDOW_S = 60
# The latest calls read: enough for a median, few enough for one quick query.
_LATEST = 20
# Fewer calls than this in the window say nothing: one slow call is not a pace.
_FEWEST = 3
# A gateway process reads the log at most this often for a queue: under a burst, the pace
# moves with the calls that end, not with each call that starts.
_FRESH_S = 1.0


@dataclass(frozen=True)
class Pace:
    """A queue's recent calls to its model: their median wait for a slot (infinite when
    most were lost to the deadline), the seconds a prompt token and an answer token took in
    those answered with the server's times (all their tokens over all their time: what the
    cache spared and what the shared slots cost included; 0 where none reported them), and
    their median answer's tokens."""

    waited_s: float
    prompt_s_per_token: float
    answer_s_per_token: float
    answer_tokens: int
    calls: int
    lost: int  # of `calls`, lost to the deadline

    @property
    def mostly_lost(self) -> bool:
        return math.isinf(self.waited_s)

    @property
    def prompt_tokens_per_s(self) -> float | None:
        return 1 / self.prompt_s_per_token if self.prompt_s_per_token else None

    @property
    def answer_tokens_per_s(self) -> float | None:
        return 1 / self.answer_s_per_token if self.answer_s_per_token else None

    def expected_s(self, *, prompt_tokens: int, max_tokens: int) -> float:
        """A call's expected time: the wait, its prompt read, an answer as long as the
        recent ones (no longer than it may be) written."""
        answer = min(self.answer_tokens, max_tokens) if max_tokens > 0 else self.answer_tokens
        return (
            self.waited_s
            + prompt_tokens * self.prompt_s_per_token
            + answer * self.answer_s_per_token
        )


_read: dict[int, tuple[float, Pace | None]] = {}
_read_lock = threading.Lock()
clock = time.monotonic


def queue_pace(queue_id: int) -> Pace | None:
    """The pace of the queue's model over the queue's calls of the last PACE_WINDOW_S, or
    None without enough of them (or with the database out of reach: no evidence)."""
    now = clock()
    with _read_lock:
        known = _read.get(queue_id)
    if known is not None and now - known[0] < _FRESH_S:
        return known[1]
    try:
        pace = _pace_of(queue_id)
    except DatabaseError:
        logger.warning("The model's pace could not be read: calls go ahead", exc_info=True)
        pace = None
    with _read_lock:
        _read[queue_id] = (now, pace)
    return pace


def _pace_of(queue_id: int) -> Pace | None:
    calls = list(
        Call.objects.filter(
            queue_id=queue_id,
            source=Call.Source.MODEL,
            status_code__in=(200, 504),
            created_at__gte=timezone.now() - timedelta(seconds=PACE_WINDOW_S),
        )
        .order_by("-created_at")
        .only(
            "status_code",
            "asks",
            "upstream_ms",
            "model_prompt_ms",
            "model_generation_ms",
            "prompt_tokens",
            "completion_tokens",
        )[:_LATEST]
    )
    if len(calls) < _FEWEST:
        return None
    # Answered with the server's times, asked once (a second ask's would blur the first's).
    timed = [c for c in calls if c.status_code == 200 and c.asks == 1 and c.waited_ms is not None]
    prompt_tokens = sum(call.prompt_tokens for call in timed)
    answer_tokens = sum(call.completion_tokens for call in timed)
    return Pace(
        waited_s=statistics.median_low(_wait_s(call) for call in calls),
        prompt_s_per_token=(
            sum(call.model_prompt_ms or 0 for call in timed) / 1000 / prompt_tokens
            if prompt_tokens
            else 0.0
        ),
        answer_s_per_token=(
            sum(call.model_generation_ms or 0 for call in timed) / 1000 / answer_tokens
            if answer_tokens
            else 0.0
        ),
        answer_tokens=round(statistics.median(c.completion_tokens for c in timed)) if timed else 0,
        calls=len(calls),
        lost=sum(call.status_code == 504 for call in calls),
    )


def _wait_s(call: Call) -> float:
    """A call's wait for the model: longer than any, lost to the deadline; where the server
    reports no times (or the model was asked twice), the upstream's whole time, which is
    then the call's pace."""
    if call.status_code == 504:
        return math.inf
    if call.asks == 1 and call.waited_ms is not None:
        return call.waited_ms / 1000
    return (call.upstream_ms or 0) / 1000
