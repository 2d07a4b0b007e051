"""The OpenAI-compatible endpoint: `POST /v1/chat/completions` (plain and streamed) and
`GET /v1/models`, in the gateway process.

One event loop per process: upstream calls wait side by side in it, while the database and
retrieval, which block, run in a thread pool of their own. Errors take OpenAI's shape, so a
caller's client raises its usual exceptions."""

import json
import logging
import threading
import time
import uuid
from typing import Any

from django.conf import settings
from django.contrib.auth.decorators import login_not_required
from django.core.exceptions import RequestDataTooBig
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt
from pydantic import ValidationError

from icrlhf.gateway import call_log, in_flight, limits, relay, services
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
from icrlhf.memory.signatures import action_message

logger = logging.getLogger(__name__)


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

    for started in [in_flight.threads.submit(opened) for _ in range(settings.GATEWAY_THREADS)]:
        try:
            started.result()
        except Exception as error:  # a database not up yet: the calls will say so, not start-up
            logger.warning("The gateway's threads could not all connect at start: %s", error)


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
        in_flight.error_body(message, kind=kind, param=param, code=code),
        status=status,
        headers=headers,
    )


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
        **(
            {"X-Icrlhf-Playbook-Version": str(plan.playbook_version)}
            if plan.playbook_version is not None
            else {}
        ),
    }


def _timing(**durations_ms: float | None) -> str:
    return ", ".join(f"{name};dur={ms:.1f}" for name, ms in durations_ms.items() if ms is not None)


@login_not_required  # bearer tokens, not sessions
@csrf_exempt
async def chat_completions(request: HttpRequest) -> HttpResponse | StreamingHttpResponse:
    started = time.monotonic()
    if request.method != "POST":
        return _error(405, "Use POST.", headers={"Allow": "POST"})
    declared = str(request.META.get("CONTENT_LENGTH") or "0")
    if not declared.isdigit() or int(declared) > settings.GATEWAY_MAX_REQUEST_BYTES:
        return _too_large()
    authenticated = await in_flight.blocking(lambda: _authenticate(request))
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
    slot = await in_flight.blocking(lambda: limits.in_flight_acquire(token.pk))
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
        plan = await in_flight.blocking(
            lambda: services.call_plan(
                queue=queue, request=chat, token_id=token.pk, trajectory_key=key
            )
        )
        call = in_flight.CallInFlight(
            id=uuid.uuid4(), plan=plan, token=token, started=started, stream=chat.stream
        )
        if chat.stream:
            include_usage = bool(chat.stream_options and chat.stream_options.include_usage)
            response = await _streamed(call, include_usage=include_usage, slot=slot)
            if isinstance(response, StreamingHttpResponse):
                release = None
            return response
        return await _answered(call)
    finally:
        if release is not None:
            await in_flight.blocking(lambda: limits.in_flight_release(slot))


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


async def _answered(call: in_flight.CallInFlight) -> HttpResponse:
    plan = call.plan
    headers = _headers(call.id, plan)
    upstream_started = time.monotonic()
    spent: dict[str, Any] = {}  # where the upstream's time went, as its server reports it
    if plan.memory_answer is not None:
        text, finish_reason, usage, upstream_ms = (
            plan.memory_answer,
            "stop",
            in_flight.usage(0, 0),
            None,
        )
        model: str = Call.Source.MEMORY
        tool_calls: list[dict[str, Any]] = []
        logprobs = None
    else:
        refused = in_flight.refusal(call)
        if refused is not None:
            return await _upstream_failed(call, refused, headers=headers)
        try:
            completion = await in_flight.before_deadline(call, llm.acomplete(**call.upstream()))
        except llm.LLMError as error:
            return await _upstream_failed(call, error, headers=headers)
        completion = await in_flight.offered_calls_only(call, completion)
        upstream_ms = in_flight.since(upstream_started)
        text, finish_reason, model = completion.text, completion.finish_reason, completion.model
        tool_calls, logprobs = list(completion.tool_calls), completion.logprobs
        usage = in_flight.usage(completion.prompt_tokens, completion.completion_tokens)
        spent = {
            "model_prompt_ms": completion.model_prompt_ms,
            "model_generation_ms": completion.model_generation_ms,
            "cached_prompt_tokens": completion.cached_prompt_tokens,
            "asks": call.asks,
        }
    total_ms = in_flight.since(call.started)
    headers["Server-Timing"] = _timing(
        retrieval=plan.retrieval_ms, upstream=upstream_ms, total=total_ms
    )
    await in_flight.blocking(
        call.log(
            answer_text=in_flight.logged_answer(text, tool_calls),
            tool_calls=tool_calls,
            total_ms=total_ms,
            upstream_ms=upstream_ms,
            prompt_tokens=usage["prompt_tokens"],
            completion_tokens=usage["completion_tokens"],
            model=model,
            **spent,
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
    call: in_flight.CallInFlight, error: llm.LLMError, *, headers: dict[str, str]
) -> JsonResponse:
    """An upstream that refused or failed before answering: the call is logged with its
    error and answered with its status, in OpenAI's shape."""
    await in_flight.blocking(
        call.log(
            answer_text="",
            total_ms=in_flight.since(call.started),
            status_code=error.status,
            error=str(error),
        )
    )
    if isinstance(error, in_flight.NoTimeLeft):
        headers = headers | {"Retry-After": str(error.retry_after_s)}
    return _error(error.status, error.summary, kind="upstream_error", headers=headers)


async def _streamed(
    call: in_flight.CallInFlight, *, include_usage: bool, slot: limits.Slot
) -> HttpResponse | StreamingHttpResponse:
    plan = call.plan
    headers = _headers(call.id, plan)
    headers["Server-Timing"] = _timing(retrieval=plan.retrieval_ms)
    upstream_started = time.monotonic()
    stream: llm.Stream | None = None
    if plan.memory_answer is None:
        refused = in_flight.refusal(call)
        if refused is not None:
            return await _upstream_failed(call, refused, headers=headers)
        try:
            # Started here, so that a refused or failing upstream is still a proper status.
            stream = await in_flight.before_deadline(call, llm.astream(**call.upstream()))
        except llm.LLMError as error:
            return await _upstream_failed(call, error, headers=headers)
    relayed = relay.Relay(
        call,
        stream=stream,
        include_usage=include_usage,
        slot=slot,
        upstream_started=upstream_started,
    )
    response = StreamingHttpResponse(
        relayed.events(), content_type="text/event-stream", headers=headers
    )
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # a proxy in front must not hold the events back
    return response


@login_not_required
async def models(request: HttpRequest, model: str | None = None) -> HttpResponse:
    """The models a token may call: its queue, named by its slug."""
    if request.method != "GET":
        return _error(405, "Use GET.", headers={"Allow": "GET"})
    authenticated = await in_flight.blocking(lambda: _authenticate(request))
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
    journal_line = await in_flight.blocking(call_log.journal_health)
    return HttpResponse(f"ok\n{journal_line}\n", content_type="text/plain")


def not_found(request: HttpRequest, exception: Exception) -> JsonResponse:
    return _error(404, f"No such endpoint: {request.path}. The API is under /v1/.")


def server_error(request: HttpRequest) -> JsonResponse:
    return _error(500, "The gateway failed on this call; it is logged.", kind="server_error")
