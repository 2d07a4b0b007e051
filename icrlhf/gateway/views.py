"""The OpenAI-compatible endpoint: `POST /v1/chat/completions` (plain and streamed) and
`GET /v1/models`, in the gateway process.

One event loop per process: upstream calls wait side by side in it, while the database and
retrieval, which block, run in a thread pool of their own. Errors take OpenAI's shape, so a
caller's client raises its usual exceptions."""

import asyncio
import json
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from django.conf import settings
from django.contrib.auth.decorators import login_not_required
from django.core.exceptions import RequestDataTooBig
from django.db import close_old_connections, connection
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt
from pydantic import ValidationError

from icrlhf.gateway import call_log, limits, services
from icrlhf.gateway.models import Call
from icrlhf.gateway.schemas import ChatRequest
from icrlhf.ingest.auth import (
    TokenGuessing,
    TokenOverLimit,
    TokenScopeMissing,
    TokenUnknown,
    token_admit,
)
from icrlhf.ingest.models import IntegrationToken, Scope
from icrlhf.integrations import llm
from icrlhf.memory.signatures import action_message, action_text, foreign_calls

logger = logging.getLogger(__name__)

_threads = ThreadPoolExecutor(max_workers=settings.GATEWAY_THREADS, thread_name_prefix="gateway")


async def _blocking[T](work: Callable[[], T]) -> T:
    def run() -> T:
        close_old_connections()  # a pool thread keeps its connection: drop it if it went bad
        return work()

    return await asyncio.get_running_loop().run_in_executor(_threads, run)


def warm_up() -> None:
    """Start every thread of the pool with its database connection open, before the first
    calls arrive: the pool starts a thread, and a thread opens its connection, on first use,
    so the first burst after start-up paid for both on top of its own work (and on
    PostgreSQL a connection costs a server process's start). The JSON schemas of a request
    are built now too."""
    ChatRequest.model_validate(
        {"model": "warm-up", "messages": [{"role": "user", "content": "hi"}]}
    )
    everyone = threading.Barrier(settings.GATEWAY_THREADS)

    def opened() -> None:
        connection.ensure_connection()
        everyone.wait(timeout=30)  # each waits for the others: one thread per task

    for started in [_threads.submit(opened) for _ in range(settings.GATEWAY_THREADS)]:
        try:
            started.result()
        except Exception as error:  # a database not up yet: the calls will say so, not start-up
            logger.warning("The gateway's threads could not all connect at start: %s", error)


def _logged(work: Callable[[], Any]) -> Callable[[], None]:
    """For work nobody awaits (a stream's log row, its slot): its failure goes to the log."""

    def run() -> None:
        close_old_connections()
        try:
            work()
        except Exception:
            logger.exception("A gateway call could not be logged or captured")

    return run


def _error(
    status: int,
    message: str,
    *,
    kind: str = "invalid_request_error",
    code: str | None = None,
    param: str | None = None,
    headers: dict[str, str] | None = None,
) -> JsonResponse:
    return JsonResponse(
        _error_body(message, kind=kind, param=param, code=code), status=status, headers=headers
    )


def _error_body(
    message: str, *, kind: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """An error in OpenAI's shape: a response's body, or a stream's event once the status
    line has gone."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def _authenticate(request: HttpRequest) -> IntegrationToken | JsonResponse:
    scheme, _, raw = request.headers.get("Authorization", "").partition(" ")
    limit = limits.calls_limit()
    try:
        return token_admit(
            request=request,
            token=raw.strip() if scheme.lower() == "bearer" else "",
            scope=Scope.GATEWAY,
            limit=limit,
        )
    except TokenUnknown:
        return _error(
            401,
            "Send a queue's integration token: `Authorization: Bearer icr_…`.",
            code="invalid_api_key",
        )
    except TokenGuessing as refused:
        return _too_many(str(refused), retry_after_s=refused.retry_after_s)
    except TokenScopeMissing:
        return _error(
            403,
            "This token does not have the “gateway” scope; an admin grants it on the token's page.",
            kind="permission_error",
            code="insufficient_scope",
        )
    except TokenOverLimit as refused:
        return _too_many(
            f"This token made more than {limit.per_minute} calls this minute "
            "(GATEWAY_REQUESTS_PER_MINUTE).",
            retry_after_s=refused.retry_after_s,
        )


def _too_many(message: str, *, retry_after_s: int) -> JsonResponse:
    return _error(
        429,
        message,
        kind="requests",
        code="rate_limit_exceeded",
        headers={"Retry-After": str(retry_after_s)},
    )


def _first_problem(error: ValidationError) -> tuple[str, str | None]:
    problem = error.errors()[0]
    where = ".".join(str(part) for part in problem["loc"])
    message = str(problem["msg"]).removeprefix("Value error, ")
    return (f"{where}: {message}" if where else message), (where or None)


def _headers(call_id: uuid.UUID, plan: services.Plan) -> dict[str, str]:
    """What shaped the answer, for the caller to log beside it."""
    return {
        "X-Icrlhf-Call": str(call_id),
        "X-Icrlhf-Source": plan.source,
        "X-Icrlhf-Memory": plan.served_memory,
        "X-Icrlhf-Examples": ",".join(f"{r.example.pk}:{r.score:.4f}" for r in plan.examples),
        **(
            {"X-Icrlhf-Memory-Confidence": f"{plan.memory_confidence:.4f}"}
            if plan.memory_confidence is not None
            else {}
        ),
    }


def _timing(**durations_ms: float | None) -> str:
    return ", ".join(f"{name};dur={ms:.1f}" for name, ms in durations_ms.items() if ms is not None)


def _since(started: float) -> float:
    return (time.monotonic() - started) * 1000


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


@login_not_required  # bearer tokens, not sessions
@csrf_exempt
async def chat_completions(request: HttpRequest) -> HttpResponse | StreamingHttpResponse:
    started = time.monotonic()
    if request.method != "POST":
        return _error(405, "Use POST.", headers={"Allow": "POST"})
    declared = str(request.META.get("CONTENT_LENGTH") or "0")
    if not declared.isdigit() or int(declared) > settings.GATEWAY_MAX_REQUEST_BYTES:
        return _too_large()
    authenticated = await _blocking(lambda: _authenticate(request))
    if isinstance(authenticated, JsonResponse):
        return authenticated
    token = authenticated
    try:
        chat = ChatRequest.model_validate(json.loads(request.body, parse_constant=_not_json))
    except RequestDataTooBig:
        return _too_large()
    except RecursionError:  # json's parser gives up on deep nesting: the caller's mistake
        return _error(400, "The request body is nested too deeply.")
    except (ValueError, UnicodeDecodeError) as error:  # ValidationError is a ValueError
        if isinstance(error, ValidationError):
            message, param = _first_problem(error)
            return _error(400, message, param=param)
        return _error(400, "The request body is not valid JSON.")
    queue = token.queue
    if chat.model != queue.slug:
        return _error(
            404,
            f"The model `{chat.model}` does not exist for this token: use its queue's slug, "
            f"`{queue.slug}`.",
            param="model",
            code="model_not_found",
        )
    slot = await _blocking(lambda: limits.in_flight_acquire(token.pk))
    if slot is None:
        return _error(
            429,
            f"This token already has {settings.GATEWAY_MAX_IN_FLIGHT_PER_TOKEN} calls in flight "
            "(GATEWAY_MAX_IN_FLIGHT_PER_TOKEN); retry when one has ended.",
            kind="requests",
            code="too_many_in_flight",
            headers={"Retry-After": "1"},
        )
    release: limits.Slot | None = slot  # a stream's events give the slot back once the stream ends
    try:
        key = request.headers.get("X-Icrlhf-Trajectory", "").replace("\x00", "")
        plan = await _blocking(
            lambda: services.call_plan(
                queue=queue, request=chat, token_id=token.pk, trajectory_key=key
            )
        )
        call = _Call(id=uuid.uuid4(), plan=plan, token=token, started=started, stream=chat.stream)
        if chat.stream:
            include_usage = bool(chat.stream_options and chat.stream_options.include_usage)
            response = await _streamed(call, include_usage=include_usage, slot=slot)
            if isinstance(response, StreamingHttpResponse):
                release = None
            return response
        return await _answered(call)
    finally:
        if release is not None:
            await _blocking(lambda: limits.in_flight_release(slot))


def _not_json(constant: str) -> Any:
    """Python's parser reads NaN and Infinity, which JSON has not (and which PostgreSQL's
    json type refuses when the call is logged): the body is not valid JSON."""
    raise ValueError(f"{constant} is not JSON")


def _too_large() -> JsonResponse:
    return _error(
        413,
        f"The request is larger than {settings.GATEWAY_MAX_REQUEST_BYTES} bytes "
        "(GATEWAY_MAX_REQUEST_BYTES).",
        code="request_too_large",
    )


class _Call:
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
        return _event(
            {
                "id": f"chatcmpl-{self.id.hex}",
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.plan.queue.slug,
                **fields,
            }
        )


class _DeadlinePassed(llm.LLMError):
    def __init__(self) -> None:
        message = (
            f"The call took longer than {settings.GATEWAY_CALL_DEADLINE_S:g} s "
            "(GATEWAY_CALL_DEADLINE_S)."
        )
        super().__init__(message, status=504)


async def _before_deadline[T](call: _Call, work: Awaitable[T]) -> T:
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
        raise _DeadlinePassed()
    return task.result()


def _leave_behind(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()  # read, so that asyncio does not log it as never retrieved


def _event(body: dict[str, Any] | str) -> str:
    return f"data: {body if isinstance(body, str) else json.dumps(body)}\n\n"


async def _answered(call: _Call) -> HttpResponse:
    plan = call.plan
    headers = _headers(call.id, plan)
    upstream_started = time.monotonic()
    if plan.memory_answer is not None:
        text, finish_reason, usage, upstream_ms = plan.memory_answer, "stop", _usage(0, 0), None
        model: str = Call.Source.MEMORY
        tool_calls: list[dict[str, Any]] = []
        logprobs = None
    else:
        try:
            completion = await _before_deadline(call, llm.acomplete(**plan.upstream()))
        except llm.LLMError as error:
            return await _upstream_failed(call, error, headers=headers)
        completion = await _offered_calls_only(call, completion)
        upstream_ms = _since(upstream_started)
        text, finish_reason, model = completion.text, completion.finish_reason, completion.model
        tool_calls, logprobs = list(completion.tool_calls), completion.logprobs
        usage = _usage(completion.prompt_tokens, completion.completion_tokens)
    total_ms = _since(call.started)
    headers["Server-Timing"] = _timing(
        retrieval=plan.retrieval_ms, upstream=upstream_ms, total=total_ms
    )
    await _blocking(
        call.log(
            answer_text=_logged_answer(text, tool_calls),
            tool_calls=tool_calls,
            total_ms=total_ms,
            upstream_ms=upstream_ms,
            prompt_tokens=usage["prompt_tokens"],
            completion_tokens=usage["completion_tokens"],
            model=model,
        )
    )
    body = {
        "id": f"chatcmpl-{call.id.hex}",
        "object": "chat.completion",
        "created": call.created,
        "model": plan.queue.slug,
        "choices": [
            {
                "index": 0,
                "message": action_message(text, tool_calls),
                "finish_reason": finish_reason,
                "logprobs": logprobs,
            }
        ],
        "usage": usage,
    }
    return JsonResponse(body, headers=headers)


async def _upstream_failed(
    call: _Call, error: llm.LLMError, *, headers: dict[str, str]
) -> JsonResponse:
    """An upstream that refused or failed before answering: the call is logged with its
    error and answered with its status, in OpenAI's shape."""
    await _blocking(
        call.log(
            answer_text="",
            total_ms=_since(call.started),
            status_code=error.status,
            error=str(error),
        )
    )
    return _error(error.status, error.summary, kind="upstream_error", headers=headers)


async def _offered_calls_only(call: _Call, completion: llm.Completion) -> llm.Completion:
    """An answer whose tool calls all name tools the request offers. A model shown other tool
    sets' calls (format examples) may copy one, and a caller's loop would then run a tool it
    never offered: the upstream is asked once more, without the format examples, a call
    counted against the token's calls a minute, and if its new answer names one too (or
    fails, or the token has no call left this minute), the caller gets what the model said,
    its words without the calls."""
    tools = call.plan.options.get("tools")
    if not foreign_calls(completion.tool_calls, tools):
        return completion
    again: llm.Completion | None = None
    token_id = call.token.pk
    if not await _blocking(lambda: limits.retry_charge(token_id)):
        logger.info("Call %s named a tool it was not offered; its token's minute is spent", call.id)
    else:
        logger.info("Call %s named a tool it was not offered: asking the model again", call.id)
        try:
            again = await _before_deadline(call, llm.acomplete(**call.plan.retry_upstream()))
        except llm.LLMError as error:
            logger.warning("Call %s: asking again failed: %s", call.id, error)
    # The caller is told the tokens both asks took.
    prompt_tokens = completion.prompt_tokens + (again.prompt_tokens if again else 0)
    completion_tokens = completion.completion_tokens + (again.completion_tokens if again else 0)
    if again is not None and not foreign_calls(again.tool_calls, tools):
        return replace(again, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens)
    said = again.text if again is not None and again.text.strip() else completion.text
    return replace(
        completion,
        text=said,
        tool_calls=(),
        finish_reason="stop",
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
    )


def _logged_answer(text: str, tool_calls: list[dict[str, Any]]) -> str:
    """The call log's answer: a plain answer as the caller got it; an action with tool calls
    as one text, the way memory writes it."""
    return action_text(text, tool_calls) if tool_calls else text


async def _streamed(
    call: _Call, *, include_usage: bool, slot: limits.Slot
) -> HttpResponse | StreamingHttpResponse:
    plan = call.plan
    headers = _headers(call.id, plan)
    headers["Server-Timing"] = _timing(retrieval=plan.retrieval_ms)
    upstream_started = time.monotonic()
    stream: llm.Stream | None = None
    if plan.memory_answer is None:
        try:
            # Started here, so that a refused or failing upstream is still a proper status.
            stream = await _before_deadline(call, llm.astream(**plan.upstream()))
        except llm.LLMError as error:
            return await _upstream_failed(call, error, headers=headers)
    relay = _Relay(
        call,
        stream=stream,
        include_usage=include_usage,
        slot=slot,
        upstream_started=upstream_started,
    )
    response = StreamingHttpResponse(
        relay.events(), content_type="text/event-stream", headers=headers
    )
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # a proxy in front must not hold the events back
    return response


class _Relay:
    """A streamed answer on its way to the caller, from the upstream's stream or, for a
    memory answer (`stream` None), in one piece; however it ends (whole, failed upstream, or
    the caller hanging up), its log row is written and its in-flight slot given back."""

    def __init__(
        self,
        call: _Call,
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
        self.retry_usage = _usage(0, 0)

    async def events(self) -> AsyncIterator[str]:
        call = self.call
        pieces = self._pieces()
        yield call.chunk({"role": "assistant", "content": ""})
        try:
            while True:
                try:  # the upstream's time only: the caller's reading is not counted
                    piece = await _before_deadline(call, anext(pieces))
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
            yield _event("[DONE]")
        except llm.LLMError as failure:
            # The status line has gone: OpenAI's clients read an error event mid-stream (the
            # upstream's own words stay in the admins' log).
            self.error, self.status = str(failure), failure.status
            yield _event(_error_body(failure.summary, kind="upstream_error"))
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
        (with its words, where none were sent yet), or none (see `_offered_calls_only`)."""
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
        served = await _offered_calls_only(self.call, first)
        self.retry_usage = _usage(served.prompt_tokens, served.completion_tokens)
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
            return _usage(0, 0)
        return _usage(
            self.stream.prompt_tokens + self.retry_usage["prompt_tokens"],
            self.stream.completion_tokens + self.retry_usage["completion_tokens"],
        )

    def _settle(self) -> None:
        """Log the call and give its slot back, on threads nobody awaits: a caller who hangs
        up cancels the events, and the row must still be written."""
        stream, usage = self.stream, self._usage()
        tool_calls = self.tool_calls
        logged = self.call.log(
            answer_text=_logged_answer(self.text, tool_calls),
            tool_calls=tool_calls,
            total_ms=_since(self.call.started),
            upstream_ms=None if stream is None else _since(self.upstream_started),
            prompt_tokens=usage["prompt_tokens"],
            completion_tokens=usage["completion_tokens"],
            model=Call.Source.MEMORY if stream is None else self.call.plan.model,
            status_code=self.status,
            error=self.error,
        )
        slot = self.slot
        _threads.submit(_logged(logged))
        _threads.submit(_logged(lambda: limits.in_flight_release(slot)))


async def _memory_pieces(text: str) -> AsyncIterator[dict[str, Any]]:
    yield {"content": text}


@login_not_required
async def models(request: HttpRequest, model: str | None = None) -> HttpResponse:
    """The models a token may call: its queue, named by its slug."""
    if request.method != "GET":
        return _error(405, "Use GET.", headers={"Allow": "GET"})
    authenticated = await _blocking(lambda: _authenticate(request))
    if isinstance(authenticated, JsonResponse):
        return authenticated
    queue = authenticated.queue
    entry = {
        "id": queue.slug,
        "object": "model",
        "created": int(queue.created_at.timestamp()),
        "owned_by": "icrlhf",
    }
    if model is None:
        return JsonResponse({"object": "list", "data": [entry]})
    if model != queue.slug:
        return _error(404, f"The model `{model}` does not exist.", code="model_not_found")
    return JsonResponse(entry)


@login_not_required
async def health(request: HttpRequest) -> HttpResponse:
    """`ok` while the process serves, then how the call log's journal stands."""
    journal_line = await _blocking(call_log.journal_health)
    return HttpResponse(f"ok\n{journal_line}\n", content_type="text/plain")


def not_found(request: HttpRequest, exception: Exception) -> JsonResponse:
    return _error(404, f"No such endpoint: {request.path}. The API is under /v1/.")


def server_error(request: HttpRequest) -> JsonResponse:
    return _error(500, "The gateway failed on this call; it is logged.", kind="server_error")
