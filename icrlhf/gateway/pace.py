"""How long a model takes to answer a call through the gateway now, read from its latest
answered calls in the log, so that a call that cannot be answered before its deadline is
refused at once (503 with Retry-After) instead of failing after the wait.

A call's time is its wait for a free slot on the model's server, then the model reading the
prompt and writing the answer. llama.cpp reports the last two beside each answer (the log
keeps them); the wait is the rest of the upstream's time. The calls of the last
PACE_WINDOW_S say what the server does under its load now. With none there that carry the
server's times (an idle model, or a server that does not report them), there is no
estimate, and the call goes ahead: a refusal needs evidence, and a model refused for a
while has its pace read afresh once the window holds no more of the slow calls."""

import statistics
import threading
import time
from dataclasses import dataclass
from datetime import timedelta

from django.utils import timezone

from icrlhf.gateway.models import Call

PACE_WINDOW_S = 60
# The latest calls read: enough for a median, few enough for one quick query.
_LATEST = 20
# A gateway process reads the log at most this often for a model: under a burst, the pace
# moves with the calls that end, not with each call that starts.
_FRESH_S = 1.0


@dataclass(frozen=True)
class Pace:
    """A model's recent calls: their median wait for a slot, the seconds a prompt token
    and an answer token took (all their tokens over all their time: what the cache spared
    and what the shared slots cost included), and their median answer's tokens."""

    waited_s: float
    prompt_s_per_token: float
    answer_s_per_token: float
    answer_tokens: int
    calls: int

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


_read: dict[str, tuple[float, Pace | None]] = {}
_read_lock = threading.Lock()
clock = time.monotonic


def model_pace(model: str) -> Pace | None:
    """The pace of `model` (as queues name it) over its answered calls of the last
    PACE_WINDOW_S, or None without such a call."""
    now = clock()
    with _read_lock:
        known = _read.get(model)
    if known is not None and now - known[0] < _FRESH_S:
        return known[1]
    pace = _pace_of(model)
    with _read_lock:
        _read[model] = (now, pace)
    return pace


def _pace_of(model: str) -> Pace | None:
    calls = list(
        Call.objects.filter(
            model=model,
            source=Call.Source.MODEL,
            status_code=200,
            created_at__gte=timezone.now() - timedelta(seconds=PACE_WINDOW_S),
            model_prompt_ms__isnull=False,
            model_generation_ms__isnull=False,
            upstream_ms__isnull=False,
        )
        .order_by("-created_at")
        .only(
            "upstream_ms",
            "model_prompt_ms",
            "model_generation_ms",
            "prompt_tokens",
            "completion_tokens",
        )[:_LATEST]
    )
    prompt_tokens = sum(call.prompt_tokens for call in calls)
    answer_tokens = sum(call.completion_tokens for call in calls)
    if prompt_tokens == 0 or answer_tokens == 0:  # none, or a server that counts no tokens
        return None
    return Pace(
        waited_s=statistics.median(call.waited_ms or 0 for call in calls) / 1000,
        prompt_s_per_token=sum(call.model_prompt_ms or 0 for call in calls) / 1000 / prompt_tokens,
        answer_s_per_token=sum(call.model_generation_ms or 0 for call in calls)
        / 1000
        / answer_tokens,
        answer_tokens=round(statistics.median(call.completion_tokens for call in calls)),
        calls=len(calls),
    )
