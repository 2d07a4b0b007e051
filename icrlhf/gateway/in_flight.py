"""A call in flight in the gateway, shared by its plain and streamed answers (views.py,
relay.py): the call and its log row, the deadline its upstream waits under, the thread pool
where blocking work runs, and the retry when the model calls a tool the request did not
offer."""

import asyncio
import json
import logging
import math
import time
import uuid
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from django.conf import settings
from django.db import close_old_connections

from icrlhf.gateway import call_log, limits, services
from icrlhf.ingest.models import IntegrationToken
from icrlhf.integrations import llm
from icrlhf.memory.signatures import action_text, foreign_calls

logger = logging.getLogger(__name__)

# The database and retrieval block: they run here, off the event loop.
threads = ThreadPoolExecutor(max_workers=settings.GATEWAY_THREADS, thread_name_prefix="gateway")


async def blocking[T](work: Callable[[], T]) -> T:
    def run() -> T:
        close_old_connections()  # a pool thread keeps its connection: drop it if it went bad
        return work()

    return await asyncio.get_running_loop().run_in_executor(threads, run)


def logged(work: Callable[[], Any]) -> Callable[[], None]:
    """For work nobody awaits (a stream's log row, its slot): its failure goes to the log."""

    def run() -> None:
        close_old_connections()
        try:
            work()
        except Exception:
            logger.exception("A gateway call could not be logged or captured")

    return run


def error_body(
    message: str, *, kind: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """An error in OpenAI's shape: a response's body, or a stream's event once the status
    line has gone."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def since(started: float) -> float:
    return (time.monotonic() - started) * 1000


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


class CallInFlight:
    """One call in flight: its plan, and its log row once it is answered."""

    def __init__(
        self,
        *,
        id: uuid.UUID,
        plan: services.Plan,
        token: IntegrationToken,
        started: float,
        stream: bool,
    ) -> None:
        self.id, self.plan, self.token, self.started, self.stream = id, plan, token, started, stream
        self.created = int(time.time())
        self.deadline = started + settings.GATEWAY_CALL_DEADLINE_S  # on time.monotonic()
        self.asks = 1  # upstream calls made for it: 2 when the model was asked again

    def time_left_s(self) -> float:
        return self.deadline - time.monotonic()

    def upstream(self) -> dict[str, Any]:
        """The plan's upstream call, waiting what is left of the deadline."""
        return self.plan.upstream(timeout_s=self.time_left_s())

    def log(self, **outcome: Any) -> Callable[[], None]:
        """Its log row's hand-over (`call_log`), for a thread to run: the row is redacted
        there, off the event loop."""

        def hand_over() -> None:
            call_log.call_log(
                services.CallLogged.of(
                    call_id=self.id, plan=self.plan, token=self.token, stream=self.stream, **outcome
                )
            )

        return hand_over

    def chunk(self, delta: dict[str, Any], finish_reason: str | None = None) -> str:
        return self._chunk(choices=[{"index": 0, "delta": delta, "finish_reason": finish_reason}])

    def usage_chunk(self, usage: dict[str, int]) -> str:
        """The last chunk, where the caller asked for usage: no choices, the tokens counted."""
        return self._chunk(choices=[], usage=usage)

    def _chunk(self, **fields: Any) -> str:
        return event(
            {
                "id": f"chatcmpl-{self.id.hex}",
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.plan.queue.slug,
                **fields,
            }
        )


class NoTimeLeft(llm.LLMError):
    """A call refused before it was sent: at the model's pace now, it would not be answered
    before its deadline (pace.py). `retry_after_s`: about when it would be; when most recent
    calls were lost, a deadline from now, when every call in flight has ended."""

    def __init__(self, *, expected_s: float, left_s: float) -> None:
        deadline_s = settings.GATEWAY_CALL_DEADLINE_S
        if math.isinf(expected_s):
            self.retry_after_s = max(1, math.ceil(deadline_s))
            why = "most of this queue's calls of the last minute were lost to the deadline"
        else:
            self.retry_after_s = max(1, min(math.ceil(expected_s - left_s), math.ceil(deadline_s)))
            why = (
                f"its calls take about {expected_s:.0f} s now, and this one had "
                f"{max(0.0, left_s):.0f} s left"
            )
        message = (
            f"The model is too busy to answer in time, so the call was not sent ({why}, "
            f"GATEWAY_CALL_DEADLINE_S {deadline_s:g} s); retry in {self.retry_after_s} s."
        )
        super().__init__(message, status=503)


def refusal(call: CallInFlight) -> NoTimeLeft | None:
    """Why the call is not sent upstream, when the model could not answer it in time."""
    expected_s, left_s = call.plan.expected_s, call.time_left_s()
    if expected_s is None or expected_s <= left_s:
        return None
    return NoTimeLeft(expected_s=expected_s, left_s=left_s)


class DeadlinePassed(llm.LLMError):
    def __init__(self) -> None:
        message = (
            f"The call took longer than {settings.GATEWAY_CALL_DEADLINE_S:g} s "
            "(GATEWAY_CALL_DEADLINE_S)."
        )
        super().__init__(message, status=504)


async def before_deadline[T](call: CallInFlight, work: Awaitable[T]) -> T:
    """Waits for the upstream until the call's deadline, then gives up with a 504.

    The upstream runs as a task of its own that is cancelled and left behind: cancelling it
    in place would not do, as litellm turns the cancellation into a connection error."""
    task = asyncio.ensure_future(work)
    try:
        done, _ = await asyncio.wait({task}, timeout=call.deadline - time.monotonic())
    except asyncio.CancelledError:  # the caller hung up
        task.cancel()
        raise
    if not done:
        task.cancel()
        task.add_done_callback(_leave_behind)
        raise DeadlinePassed()
    return task.result()


def _leave_behind(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()  # read, so that asyncio does not log it as never retrieved


def event(body: dict[str, Any] | str) -> str:
    return f"data: {body if isinstance(body, str) else json.dumps(body)}\n\n"


async def offered_calls_only(call: CallInFlight, completion: llm.Completion) -> llm.Completion:
    """An answer whose tool calls all name tools the request offers. A model shown other tool
    sets' calls (format examples) may copy one, and a caller's loop would then run a tool it
    never offered: the upstream is asked once more, without the format examples, a call
    counted against the token's calls a minute, and if its new answer names one too (or
    fails, or the token has no call left this minute, or asking again would send the same
    prompt at temperature 0), the caller gets what the model said, its words without the
    calls."""
    tools = call.plan.options.get("tools")
    if not foreign_calls(completion.tool_calls, tools):
        return completion
    again: llm.Completion | None = None
    token_id = call.token.pk
    retry = call.plan.retry_upstream(timeout_s=call.time_left_s())
    if retry is None:
        logger.info("Call %s named a tool it was not offered; the same prompt would too", call.id)
    elif not await blocking(lambda: limits.retry_charge(token_id)):
        logger.info("Call %s named a tool it was not offered; its token's minute is spent", call.id)
    else:
        logger.info("Call %s named a tool it was not offered: asking the model again", call.id)
        call.asks = 2
        try:
            again = await before_deadline(call, llm.acomplete(**retry))
        except llm.LLMError as error:
            logger.warning("Call %s: asking again failed: %s", call.id, error)
    both = _both_asks(completion, again)  # the caller is told the tokens both asks took
    if again is not None and not foreign_calls(again.tool_calls, tools):
        return replace(again, **both)
    said = again.text if again is not None and again.text.strip() else completion.text
    return replace(completion, text=said, tool_calls=(), finish_reason="stop", **both)


def _both_asks(first: llm.Completion, again: llm.Completion | None) -> dict[str, Any]:
    """The tokens and the model's times of both asks together (of the first alone when the
    second failed)."""
    asks = [first] if again is None else [first, again]

    def total(times: list[float | None]) -> float | None:
        return None if None in times else sum(t for t in times if t is not None)

    return {
        "prompt_tokens": sum(a.prompt_tokens for a in asks),
        "completion_tokens": sum(a.completion_tokens for a in asks),
        "cached_prompt_tokens": sum(a.cached_prompt_tokens for a in asks),
        "model_prompt_ms": total([a.model_prompt_ms for a in asks]),
        "model_generation_ms": total([a.model_generation_ms for a in asks]),
    }


def logged_answer(text: str, tool_calls: list[dict[str, Any]]) -> str:
    """The call log's answer: a plain answer as the caller got it; an action with tool calls
    as one text, the way memory writes it."""
    return action_text(text, tool_calls) if tool_calls else text
