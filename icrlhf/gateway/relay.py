"""A streamed answer on its way to the caller (Server-Sent Events, as OpenAI sends them)."""

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from icrlhf.gateway import in_flight, limits
from icrlhf.gateway.models import Call
from icrlhf.integrations import llm
from icrlhf.memory.signatures import foreign_calls


class Relay:
    """A streamed answer on its way to the caller, from the upstream's stream or, for a
    memory answer (`stream` None), in one piece; however it ends (whole, failed upstream, or
    the caller hanging up), its log row is written and its in-flight slot given back."""

    def __init__(
        self,
        call: in_flight.CallInFlight,
        *,
        stream: llm.Stream | None,
        include_usage: bool,
        slot: limits.Slot,
        upstream_started: float,
    ) -> None:
        self.call, self.stream, self.include_usage = call, stream, include_usage
        self.slot, self.upstream_started = slot, upstream_started
        self.text, self.error, self.status = "", "", 200
        # Tool calls are held until the stream ends, then sent only if each names a tool the
        # request offers (see `_calls_to_send`): what the caller got, for its log row.
        self.held: list[dict[str, Any]] = []
        self.tool_calls: list[dict[str, Any]] = []
        self.finish_reason: str | None = None  # where the held calls changed it
        self.retry_usage = in_flight.usage(0, 0)

    async def events(self) -> AsyncIterator[str]:
        call = self.call
        pieces = self._pieces()
        yield call.chunk({"role": "assistant", "content": ""})
        try:
            while True:
                try:  # the upstream's time only: the caller's reading is not counted
                    piece = await in_flight.before_deadline(call, anext(pieces))
                except StopAsyncIteration:
                    break
                if "tool_calls" in piece:
                    self.held.append(piece)
                    continue
                self.text += piece.get("content", "")
                yield call.chunk(piece)
            for piece in await self._calls_to_send():
                yield call.chunk(piece)
            yield call.chunk({}, finish_reason=self._finish_reason())
            if self.include_usage:
                yield call.usage_chunk(self._usage())
            yield in_flight.event("[DONE]")
        except llm.LLMError as failure:
            # The status line has gone: OpenAI's clients read an error event mid-stream (the
            # upstream's own words stay in the admins' log).
            self.error, self.status = str(failure), failure.status
            yield in_flight.event(in_flight.error_body(failure.summary, kind="upstream_error"))
        except (asyncio.CancelledError, GeneratorExit):
            self.error, self.status = "The caller hung up before the answer ended.", 499
            raise
        finally:
            self._settle()

    def _pieces(self) -> AsyncIterator[dict[str, Any]]:
        if self.stream is None:
            return _memory_pieces(self.call.plan.memory_answer or "")
        return aiter(self.stream)

    async def _calls_to_send(self) -> list[dict[str, Any]]:
        """Once the stream has ended, the tool call pieces to send: those held, when each
        call names a tool the request offers; else the calls of the upstream asked once more
        (with its words, where none were sent yet), or none (see `in_flight.offered_calls_only`)."""
        stream = self.stream
        if stream is None or not stream.tool_calls:
            return []
        if not foreign_calls(stream.tool_calls, self.call.plan.options.get("tools")):
            self.tool_calls = list(stream.tool_calls)
            return self.held
        first = llm.Completion(
            text=self.text,
            model=self.call.plan.model,
            prompt_tokens=0,
            completion_tokens=0,
            cost_usd=0.0,
            latency_ms=0,
            tool_calls=tuple(stream.tool_calls),
        )
        served = await in_flight.offered_calls_only(self.call, first)
        self.retry_usage = in_flight.usage(served.prompt_tokens, served.completion_tokens)
        self.tool_calls = list(served.tool_calls)
        self.finish_reason = "tool_calls" if served.tool_calls else "stop"
        pieces: list[dict[str, Any]] = []
        if served.text and not self.text:
            self.text = served.text
            pieces.append({"content": served.text})
        if served.tool_calls:
            pieces.append(
                {"tool_calls": [{"index": i, **c} for i, c in enumerate(served.tool_calls)]}
            )
        return pieces

    def _finish_reason(self) -> str:
        if self.finish_reason is not None:
            return self.finish_reason
        return "stop" if self.stream is None else self.stream.finish_reason

    def _usage(self) -> dict[str, int]:
        if self.stream is None:
            return in_flight.usage(0, 0)
        return in_flight.usage(
            self.stream.prompt_tokens + self.retry_usage["prompt_tokens"],
            self.stream.completion_tokens + self.retry_usage["completion_tokens"],
        )

    def _settle(self) -> None:
        """Log the call and give its slot back, on threads nobody awaits: a caller who hangs
        up cancels the events, and the row must still be written."""
        stream, usage = self.stream, self._usage()
        tool_calls = self.tool_calls
        logged = self.call.log(
            answer_text=in_flight.logged_answer(self.text, tool_calls),
            tool_calls=tool_calls,
            total_ms=in_flight.since(self.call.started),
            upstream_ms=None if stream is None else in_flight.since(self.upstream_started),
            prompt_tokens=usage["prompt_tokens"],
            completion_tokens=usage["completion_tokens"],
            model=Call.Source.MEMORY if stream is None else self.call.plan.model,
            status_code=self.status,
            error=self.error,
            asks=self.call.asks,  # a stream carries no model times: litellm drops llama.cpp's
        )
        slot = self.slot
        in_flight.threads.submit(in_flight.logged(logged))
        in_flight.threads.submit(in_flight.logged(lambda: limits.in_flight_release(slot)))


async def _memory_pieces(text: str) -> AsyncIterator[dict[str, Any]]:
    yield {"content": text}
