"""The one place that talks to language models (through litellm).

litellm is imported on first use, not at import: the web process imports this module (through
the services) but never calls a model, and litellm costs seconds and ~150 MB to load.
"""

import asyncio
import concurrent.futures
import importlib
import json
import logging
import os
import re
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from types import ModuleType
from typing import Any

from django.conf import settings

from icrlhf.integrations.text_checks import storable
from icrlhf.integrations.text_tool_calls import (
    calls_in_text,
    could_become_calls,
    offered_tools,
)

logger = logging.getLogger(__name__)

# Sampling parameters a queue may set; anything else in its params is ignored, so a queue
# cannot smuggle provider options (base URLs, keys, mock switches) into the call.
SAMPLING_PARAMS = frozenset(
    {"temperature", "top_p", "max_tokens", "seed", "stop", "presence_penalty", "frequency_penalty"}
)
_MAX_ERROR_CHARS = 400
# litellm prefixes its messages with class names ("litellm.InternalServerError: Internal…").
_NOISE = re.compile(r"^(?:litellm\.\w+: |\w+Error: |\w*Exception - )+")


class LLMError(Exception):
    """A failed LLM call, with a message fit to show a reviewer.

    `status` is the HTTP status that tells a caller of the gateway what went wrong upstream:
    429 rate-limited, 504 timed out, 502 unreachable or failing, 400 a request it refused."""

    def __init__(self, message: str, *, status: int = 502) -> None:
        super().__init__(message)
        self.status = status

    @property
    def summary(self) -> str:
        """What went wrong without the upstream's own words (its error body may hold what
        the endpoint's owner chose to put there): for anyone but an admin."""
        return error_summary(str(self))


def error_summary(message: str) -> str:
    # Messages read "<what happened>: <the upstream's detail>" (see _describe).
    return message.partition(": ")[0]


class TransientLLMError(LLMError):
    """Rate limit, timeout, connection trouble or a 5xx: retry later."""


class PermanentLLMError(LLMError):
    """A call that will fail the same way again (bad request, auth, garbage answer)."""


@dataclass(frozen=True)
class Completion:
    text: str
    model: str
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float
    latency_ms: int
    finish_reason: str = "stop"  # "length": cut at the token limit; "tool_calls"
    # In OpenAI's shape: [{"id", "type": "function", "function": {"name", "arguments"}}].
    tool_calls: tuple[dict[str, Any], ...] = ()
    logprobs: dict[str, Any] | None = None  # where the upstream returned them


@cache
def _litellm() -> ModuleType:
    # Without this, litellm fetches a price list from the internet at import.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    litellm.suppress_debug_info = True
    litellm.telemetry = False
    return litellm


@cache
def _register_if_unlisted(model: str) -> None:
    """Registers a model litellm's price map lacks (a local server's) at no price, once per
    process. litellm prices every call: an unlisted model sent its cost calculator searching
    the map and its fallbacks a dozen times a call before giving up, 0.3-0.4 ms of the ~2.9 ms
    of CPU a call took against a local 0-latency server; registered, the search stops at
    once. A model the map lists keeps its price; an unlisted one costs 0, as before."""
    litellm = _litellm()
    try:
        litellm.get_model_info(model)
        return
    except Exception:  # litellm raises a bare Exception for a model it does not know
        pass
    try:
        provider = litellm.get_llm_provider(model)[1]
    except Exception:  # a model with no provider: the call itself reports it
        return
    no_price = {
        "litellm_provider": provider,
        "mode": "chat",
        "input_cost_per_token": 0.0,
        "output_cost_per_token": 0.0,
        # Without these, litellm warns that cached tokens will cost 0, as all of them do.
        "cache_creation_input_token_cost": 0.0,
        "cache_read_input_token_cost": 0.0,
    }
    litellm.register_model({model: no_price})


@cache
def _transient_errors() -> tuple[type[Exception], ...]:
    """Errors that may pass on their own: worth a retry with backoff."""
    litellm = _litellm()
    return (
        litellm.RateLimitError,
        litellm.Timeout,
        litellm.APIConnectionError,
        litellm.InternalServerError,
        litellm.ServiceUnavailableError,
        litellm.BadGatewayError,
    )


@cache
def _error_labels() -> tuple[tuple[type[Exception], str, int], ...]:
    # Most specific first: several of litellm's errors subclass others (Timeout is a
    # connection error, a context-window error is a bad request).
    litellm = _litellm()
    return (
        (litellm.Timeout, "The model did not answer in time", 504),
        (litellm.RateLimitError, "The model is rate-limited", 429),
        (litellm.APIConnectionError, _UNREACHABLE, 502),
        (litellm.ServiceUnavailableError, "The model's server is unavailable", 502),
        (litellm.BadGatewayError, "The model's server is unavailable", 502),
        (litellm.InternalServerError, "The model's server failed", 502),
        (litellm.AuthenticationError, "The model rejected the API key", 502),
        (litellm.NotFoundError, "The model was not found", 502),
        (litellm.ContextWindowExceededError, "The prompt is too long for the model", 400),
        (litellm.BadRequestError, "The model rejected the request", 400),
    )


_UNREACHABLE = "The model could not be reached"


def sampling_params(params: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in params.items() if key in SAMPLING_PARAMS}


def complete(
    *,
    messages: list[dict[str, Any]],
    model: str,
    params: dict[str, Any],
    api_base: str = "",
    response_format: dict[str, Any] | None = None,
    mock_response: str | None = None,
) -> Completion:
    """One chat completion. `mock_response` is litellm's own offline switch, for tests."""
    litellm = _litellm()
    _register_if_unlisted(model)
    started = time.monotonic()
    extra = _extra(mock_response)
    try:
        response = litellm.completion(
            model=model,
            messages=messages,
            **_call_options(params, api_base, response_format),
            **extra,
        )
    except Exception as error:  # litellm raises many types: sorted by _failure.
        raise _failure(error) from error
    latency_ms = int((time.monotonic() - started) * 1000)
    return _completion_from(response, model=model, latency_ms=latency_ms)


# Sent instead of a key where the install has none for an endpoint: with no key at all,
# litellm would fall back to a provider key in the environment (OPENAI_API_KEY…).
NO_KEY = "no-key-for-this-endpoint"


def endpoints() -> dict[str, dict[str, str]]:
    """The endpoints a queue may call, by name: the install's own first. Each has its model,
    api_base and key, and its `context_window` (tokens, as digits) where the install sets one."""
    own = {"model": settings.LLM_MODEL, "api_base": settings.LLM_API_BASE}
    window = settings.LLM_CONTEXT_WINDOW
    own_window = {"context_window": str(window)} if window > 0 else {}
    return {
        "default": {**own, "key": settings.LLM_API_KEY, **own_window},
        **settings.LLM_ENDPOINTS,
    }


def api_key_for(api_base: str) -> str | None:
    """The key of the named endpoint at this base URL (LLM_ENDPOINTS; empty: the install's
    own), else none at all: a key goes to its own endpoint only. None: litellm reads the
    provider's key from the environment, as an install without LLM_API_KEY intends."""
    wanted = (api_base or settings.LLM_API_BASE).rstrip("/")
    for endpoint in endpoints().values():
        if endpoint["api_base"].rstrip("/") == wanted:
            return endpoint["key"] or None
    return NO_KEY


def endpoint_named(api_base: str, model: str) -> str:
    """The name of the endpoint a queue's model and base URL stand for ("" if none)."""
    wanted = ((api_base or settings.LLM_API_BASE).rstrip("/"), model or settings.LLM_MODEL)
    for name, endpoint in endpoints().items():
        if (endpoint["api_base"].rstrip("/"), endpoint["model"]) == wanted:
            return name
    return ""


def context_window(model: str, api_base: str = "") -> int | None:
    """How many tokens `model` at `api_base` (empty: the install's LLM_API_BASE) takes, its
    prompt and its answer together (litellm's figure is the prompt's limit alone: the fit
    is then the more cautious): the endpoint's setting (LLM_CONTEXT_WINDOW, or the
    `context_window` of its LLM_ENDPOINTS entry), else what its server reports, else what
    litellm knows of the model; None when none of them says. Cheap after a process's first
    call for an endpoint: the gateway asks for every call."""
    model = model or settings.LLM_MODEL
    configured = endpoints().get(endpoint_named(api_base, model), {}).get("context_window")
    if configured:
        return int(configured)
    return _server_window(api_base or settings.LLM_API_BASE) or _known_window(model)


# The server is asked while a call waits for its prompt: it answers at once or not at all.
_WINDOW_ASK_TIMEOUT_S = 2.0
# A server that did not say is asked again after this long: it may have been starting (a
# process that asked then would otherwise never fit its prompts).
_WINDOW_ASK_AGAIN_S = 60.0
# By base URL: (the window the server reported, or None; when it was asked), and the lock
# held while that server is asked.
_reported_windows: dict[str, tuple[int | None, float]] = {}
_asking_locks: dict[str, threading.Lock] = {}
_asking_locks_lock = threading.Lock()


def _server_window(api_base: str) -> int | None:
    """The context window the server at `api_base` reports, asked once per process. Calls
    to that server wait while it is asked (up to 2 s) and take its answer; calls to other
    endpoints never wait for it."""
    if not api_base:
        return None  # a provider's own endpoint, whose models litellm knows
    base = api_base.rstrip("/")
    with _asking_locks_lock:
        asking = _asking_locks.setdefault(base, threading.Lock())
    with asking:
        window, asked_at = _reported_windows.get(base, (None, -_WINDOW_ASK_AGAIN_S))
        if window is None and time.monotonic() - asked_at >= _WINDOW_ASK_AGAIN_S:
            window = _server_window_asked(base)
            _reported_windows[base] = (window, time.monotonic())
        return window


def _server_window_asked(api_base: str) -> int | None:
    """llama.cpp's server reports the context one request may use (`n_ctx` of its default
    generation settings) at GET /props, beside its OpenAI routes under /v1. Any other
    server, or none answering in time: unknown."""
    import httpx

    key = api_key_for(api_base)
    try:
        response = httpx.get(
            api_base.removesuffix("/v1") + "/props",
            headers={"Authorization": f"Bearer {key}"} if key else {},
            timeout=_WINDOW_ASK_TIMEOUT_S,
        )
        response.raise_for_status()
        window = response.json()["default_generation_settings"]["n_ctx"]
    except (httpx.HTTPError, ValueError, LookupError, TypeError) as error:
        logger.info("%s did not report its context window: %s", api_base, error)
        return None
    return window if isinstance(window, int) and window > 0 else None


@cache
def _known_window(model: str) -> int | None:
    """The prompt tokens litellm's model list gives a model it knows (OpenAI's, Anthropic's…)."""
    try:
        info = _litellm().get_model_info(model)
    except Exception:  # litellm raises a bare Exception for a model it does not know
        return None
    window = info.get("max_input_tokens")
    return window if isinstance(window, int) and window > 0 else None


def _extra(mock_response: str | None) -> dict[str, Any]:
    return {} if mock_response is None else {"mock_response": mock_response}


def _call_options(
    params: dict[str, Any], api_base: str, response_format: dict[str, Any] | None = None
) -> dict[str, Any]:
    structured = {} if response_format is None else {"response_format": response_format}
    return {
        # Tools here are the caller's functions, passed on: never litellm's own MCP servers,
        # whose handler (litellm's proxy) it would otherwise load for any call with tools.
        "_skip_mcp_handler": True,
        **structured,
        "api_base": api_base or settings.LLM_API_BASE or None,
        "api_key": api_key_for(api_base),
        "timeout": settings.LLM_TIMEOUT_S,
        "num_retries": 0,  # Celery owns the retries, with backoff and a cap; callers own theirs.
        **sampling_params(params),
    }


def _failure(error: Exception) -> LLMError:
    if isinstance(error, LLMError):
        return error
    transient = isinstance(error, _transient_errors())
    if transient and _in_chain(error, json.JSONDecodeError):
        # A 200 whose body is not JSON: a misconfigured endpoint, not a passing fault.
        return PermanentLLMError("The model's answer could not be read: not JSON.")
    message, status = _describe(error)
    return (TransientLLMError if transient else PermanentLLMError)(message, status=status)


async def acomplete(
    *,
    messages: list[dict[str, Any]],
    model: str,
    params: dict[str, Any],
    api_base: str = "",
    response_format: dict[str, Any] | None = None,
    options: dict[str, Any] | None = None,
    mock_response: str | None = None,
) -> Completion:
    """`complete` for an event loop (the gateway): many calls wait at once in one thread.
    `options`: a caller's tool and output fields (tools, tool_choice, response_format, …),
    passed on as they are."""
    response, latency_ms = await _acompletion(
        messages=messages,
        model=model,
        params=params,
        api_base=api_base,
        response_format=response_format,
        options=options,
        mock_response=mock_response,
    )
    return _completion_from(
        response, model=model, latency_ms=latency_ms, offered=offered_tools(options)
    )


async def acomplete_n(
    *,
    messages: list[dict[str, Any]],
    model: str,
    params: dict[str, Any],
    n: int,
    api_base: str = "",
    response_format: dict[str, Any] | None = None,
    options: dict[str, Any] | None = None,
    mock_response: str | None = None,
) -> list[Completion]:
    """Up to `n` answers to one prompt from one request (OpenAI's `n`): the prompt is sent and
    processed once. A server that ignores `n` answers once."""
    response, latency_ms = await _acompletion(
        messages=messages,
        model=model,
        params=params,
        api_base=api_base,
        response_format=response_format,
        options=options,
        mock_response=mock_response,
        n=n,
    )
    return _completions_from(
        response, model=model, latency_ms=latency_ms, offered=offered_tools(options)
    )


async def _acompletion(
    *,
    messages: list[dict[str, Any]],
    model: str,
    params: dict[str, Any],
    api_base: str,
    response_format: dict[str, Any] | None,
    options: dict[str, Any] | None,
    mock_response: str | None,
    **asked: Any,
) -> tuple[Any, int]:
    """One litellm call on the event loop (`asked`: more of OpenAI's fields, such as `n`):
    its response, and how long it took in ms."""
    litellm = _litellm()
    _register_if_unlisted(model)
    started = time.monotonic()
    try:
        response = await litellm.acompletion(
            model=model,
            messages=messages,
            **asked,
            **(_call_options(params, api_base, response_format) | (options or {})),
            **_extra(mock_response),
        )
    except Exception as error:
        raise _failure(error) from error
    return response, int((time.monotonic() - started) * 1000)


@dataclass(frozen=True)
class Call:
    """One chat completion to make: what `complete` takes."""

    messages: list[dict[str, Any]]
    model: str
    params: dict[str, Any]
    api_base: str = ""
    # Structured output (a JSON schema the server holds the answer to), or None.
    response_format: dict[str, Any] | None = None
    # A caller's tool and output fields (a captured agent step's tools), passed on as they are.
    options: dict[str, Any] | None = None


class _EventLoop:
    """One event loop per process, on a thread of its own, for the worker's calls: N calls
    of a generation wait at once on one thread and share one connection pool, instead of
    N threads contending for the GIL. Started on first use, and again after a fork."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pid = 0

    def get(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._pid != os.getpid():
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="llm-calls", daemon=True).start()
                self._loop, self._pid = loop, os.getpid()
            return self._loop


_event_loop = _EventLoop()


# Endpoints that answered a request for several answers with one: asked one at a time after.
_answers_once: set[tuple[str, str]] = set()
# Endpoints that refused structured output: asked without it after, their answers then read
# by the kind's tolerant parser (a provider without JSON schemas still answers).
_no_structured_output: set[tuple[str, str]] = set()


def _response_format(call: Call) -> dict[str, Any] | None:
    return None if (call.model, call.api_base) in _no_structured_output else call.response_format


def _refuses_structure(error: PermanentLLMError) -> bool:
    """The endpoint refused structured output itself: litellm knows the provider lacks it, or
    the server names the field. Any other bad request (one that merely mentions a schema)
    does not turn structured output off for the endpoint."""
    if _in_chain(error, _litellm().UnsupportedParamsError):
        return True
    said = str(error).lower()
    return "response_format" in said or "json_schema" in said


async def _structured_or_not[T](
    call: Call, ask: Callable[[dict[str, Any] | None], Awaitable[T]]
) -> T:
    """Asks with the call's structured output, and once more without it if the endpoint
    refuses it (remembered for the rest of the process)."""
    wanted = _response_format(call)
    try:
        return await ask(wanted)
    except PermanentLLMError as error:
        if wanted is None or not _refuses_structure(error):
            raise
        logger.warning("%s refused structured output; asking without it: %s", call.model, error)
        _no_structured_output.add((call.model, call.api_base))
        return await ask(None)


Arrived = list[tuple[int, "Completion | LLMError"]]


def complete_n(call: Call, n: int) -> Iterator[Arrived]:
    """`n` answers to one call, yielded as they arrive: each time, those that arrived
    together, as (0…n-1, its completion or its error).

    One request asks for all n (`n`): OpenAI, vLLM and llama.cpp's server process the prompt
    once and write the answers together, and the worker pays one call's CPU instead of n. A
    server that answers once (it ignores `n`) is asked for the rest one call each, and from
    then on always so; one that refuses `n` (it is not supported, or more than its parallel
    slots) is asked n times at once for this generation."""
    endpoint = (call.model, call.api_base)
    if n == 1 or endpoint in _answers_once:
        yield from ([arrived] for arrived in _complete_each(call, n))
        return
    future = asyncio.run_coroutine_threadsafe(
        _structured_or_not(
            call,
            lambda response_format: acomplete_n(
                messages=call.messages,
                model=call.model,
                params=call.params,
                api_base=call.api_base,
                n=n,
                response_format=response_format,
                options=call.options,
            ),
        ),
        _event_loop.get(),
    )
    try:
        completions = future.result(timeout=settings.LLM_TIMEOUT_S + 30)
    except PermanentLLMError:
        yield from ([arrived] for arrived in _complete_each(call, n))
        return
    except TransientLLMError as error:
        yield [(index, error) for index in range(n)]
        return
    except TimeoutError:
        future.cancel()
        late = TransientLLMError("The model did not answer in time", status=504)
        yield [(index, late) for index in range(n)]
        return
    yield list(enumerate(completions[:n]))
    if len(completions) < n:
        _answers_once.add(endpoint)
        for index, outcome in _complete_each(call, n - len(completions)):
            yield [(len(completions) + index, outcome)]


def _complete_each(call: Call, count: int) -> Iterator[tuple[int, Completion | LLMError]]:
    """Makes the call `count` times at once and yields (0…count-1, its completion or its
    error) as each one ends, so a caller can save every answer the moment it arrives.

    A call still unanswered LLM_TIMEOUT_S + 30 s after the last one started (a stuck event
    loop; litellm's own timeout ends a stuck call sooner) is reported as timed out."""
    loop = _event_loop.get()
    pending = {
        asyncio.run_coroutine_threadsafe(
            _structured_or_not(
                call,
                lambda response_format: acomplete(
                    messages=call.messages,
                    model=call.model,
                    params=call.params,
                    api_base=call.api_base,
                    response_format=response_format,
                    options=call.options,
                ),
            ),
            loop,
        ): index
        for index in range(count)
    }
    try:
        for future in concurrent.futures.as_completed(pending, timeout=settings.LLM_TIMEOUT_S + 30):
            index = pending.pop(future)
            try:
                yield index, future.result()
            except LLMError as error:
                yield index, error
    except TimeoutError:
        for future, index in pending.items():
            future.cancel()
            yield index, TransientLLMError("The model did not answer in time", status=504)


class Stream:
    """A streamed completion: iterate for the text as it comes; once the iteration ends,
    `prompt_tokens` and `completion_tokens` hold the usage (estimated if the model sent none).
    A failure before or during the stream raises LLMError."""

    def __init__(
        self,
        *,
        messages: list[dict[str, Any]],
        chunks: AsyncIterator[Any],
        offered: frozenset[str] = frozenset(),
    ) -> None:
        self._messages = messages
        self._chunks = chunks
        # The request's tools: words that may yet turn out to be calls of them are held back.
        self._offered = offered
        self._held = ""
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.text = ""
        self.finish_reason = "stop"
        self.tool_calls: list[dict[str, Any]] = []  # assembled from the deltas, by index

    async def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        """Each delta to pass on, in OpenAI's shape: {"content": …} or {"tool_calls": […]}."""
        try:
            async for chunk in self._chunks:
                usage = getattr(chunk, "usage", None)
                if usage is not None:
                    self.prompt_tokens = int(getattr(usage, "prompt_tokens", 0) or 0)
                    self.completion_tokens = int(getattr(usage, "completion_tokens", 0) or 0)
                choices = getattr(chunk, "choices", None) or []
                if choices and getattr(choices[0], "finish_reason", None):
                    self.finish_reason = str(choices[0].finish_reason)
                delta = getattr(choices[0], "delta", None) if choices else None
                piece = getattr(delta, "content", None) or ""
                if piece:
                    for words in self._words(storable(piece)):
                        yield words
                calls = [
                    _tool_call_delta(call) for call in getattr(delta, "tool_calls", None) or []
                ]
                if calls:
                    self._assemble(calls)
                    yield {"tool_calls": calls}
        except Exception as error:
            raise _failure(error) from error
        if self._held:
            yield self._held_answer()
        if self.tool_calls and self.finish_reason == "stop":
            self.finish_reason = "tool_calls"  # some servers say "stop" after tool calls
        if not self.prompt_tokens:
            self.prompt_tokens = sum(count_tokens(_text_of(m)) for m in self._messages)
        if not self.completion_tokens and (self.text or self.tool_calls):
            self.completion_tokens = count_tokens(self.text + json.dumps(self.tool_calls))

    def _words(self, piece: str) -> Iterator[dict[str, Any]]:
        """The words to pass on now: none while what has come may still be calls only."""
        if self._offered and not self.text and could_become_calls(self._held + piece):
            self._held += piece
            return
        piece, self._held = self._held + piece, ""
        self.text += piece
        yield {"content": piece}

    def _held_answer(self) -> dict[str, Any]:
        """The held-back answer, once it has ended: calls, when it is calls only."""
        held, self._held = self._held, ""
        calls = [] if self.tool_calls else calls_in_text(held, self._offered)
        if not calls:
            self.text += held
            return {"content": held}
        self.tool_calls = [dict(call) for call in calls]
        self.finish_reason = "tool_calls"
        return {"tool_calls": [{"index": i, **call} for i, call in enumerate(calls)]}

    def _assemble(self, deltas: list[dict[str, Any]]) -> None:
        for delta in deltas:
            index = int(delta.get("index") or 0)
            while len(self.tool_calls) <= index:
                empty = {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
                self.tool_calls.append(empty)
            call = self.tool_calls[index]
            call["id"] = delta.get("id") or call["id"]
            function = delta.get("function") or {}
            call["function"]["name"] += function.get("name") or ""
            call["function"]["arguments"] += function.get("arguments") or ""


def _text_of(message: dict[str, Any]) -> str:
    content = message.get("content")
    return content if isinstance(content, str) else ""


def _tool_call_delta(call: Any) -> dict[str, Any]:
    """A streamed tool call's piece as OpenAI streams it: index, and what this piece adds."""
    function = getattr(call, "function", None)
    delta: dict[str, Any] = {"index": int(getattr(call, "index", 0) or 0)}
    if getattr(call, "id", None):
        delta["id"] = storable(str(call.id))
        delta["type"] = "function"
    pieces = {
        "name": getattr(function, "name", None),
        "arguments": getattr(function, "arguments", None),
    }
    delta["function"] = {
        key: storable(str(value)) for key, value in pieces.items() if value is not None
    }
    return delta


async def astream(
    *,
    messages: list[dict[str, Any]],
    model: str,
    params: dict[str, Any],
    api_base: str = "",
    options: dict[str, Any] | None = None,
    mock_response: str | None = None,
) -> Stream:
    """Starts a streamed completion. Connection and request errors raise here, before
    anything is sent to the caller, so they can still become a proper error response."""
    litellm = _litellm()
    _register_if_unlisted(model)
    extra = _extra(mock_response)
    try:
        chunks = await litellm.acompletion(
            model=model,
            messages=messages,
            stream=True,
            stream_options={"include_usage": True},
            **_call_options(params, api_base),
            **(options or {}),
            **extra,
        )
    except Exception as error:
        raise _failure(error) from error
    return Stream(messages=messages, chunks=chunks, offered=offered_tools(options))


def _completion_from(
    response: Any, *, model: str, latency_ms: int, offered: frozenset[str] = frozenset()
) -> Completion:
    return _completions_from(response, model=model, latency_ms=latency_ms, offered=offered)[0]


def _completions_from(
    response: Any, *, model: str, latency_ms: int, offered: frozenset[str] = frozenset()
) -> list[Completion]:
    """One completion per choice of the response (several when `n` asked for several).
    An answer that is nothing but calls of the `offered` tools, written as text, is those
    calls (integrations/text_tool_calls.py).

    With several, each answer's completion tokens are estimated from its text (servers
    disagree on what their usage counts: OpenAI the sum, llama.cpp one answer's) and the
    call's cost is shared out in proportion; each counts the prompt it was written for."""
    try:
        choices = list(response.choices)
        contents = [choice.message.content for choice in choices]
        tool_calls = [_tool_calls_of(choice.message) for choice in choices]
    except (AttributeError, TypeError) as error:
        raise PermanentLLMError("The model's answer had no message in it.") from error
    if not choices:
        raise PermanentLLMError("The model's answer had no message in it.")
    # An answer is untrusted text, which must reach the call log as it reaches the caller.
    texts = [storable(c).strip() if isinstance(c, str) else "" for c in contents]
    finish_reasons = [str(choice.finish_reason or "") for choice in choices]
    for index, (text, calls) in enumerate(zip(texts, tool_calls, strict=True)):
        written = () if calls else calls_in_text(text, offered)
        if written:
            texts[index], tool_calls[index], finish_reasons[index] = "", written, "tool_calls"
    if not all(text or calls for text, calls in zip(texts, tool_calls, strict=True)):
        raise PermanentLLMError("The model returned an empty answer.")
    usage = getattr(response, "usage", None)
    reported = int(getattr(usage, "completion_tokens", 0) or 0)
    tokens = [reported] if len(texts) == 1 else [count_tokens(text) for text in texts]
    # litellm prices the call itself; unknown models (local ones) have no price.
    cost = float((getattr(response, "_hidden_params", None) or {}).get("response_cost") or 0.0)
    return [
        Completion(
            text=text,
            model=str(getattr(response, "model", None) or model),
            prompt_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
            completion_tokens=answer_tokens,
            cost_usd=cost * answer_tokens / max(1, sum(tokens)),
            latency_ms=latency_ms,
            finish_reason=finish_reason or ("tool_calls" if calls else "stop"),
            tool_calls=calls,
            logprobs=_plain(getattr(choice, "logprobs", None)),
        )
        for text, choice, answer_tokens, calls, finish_reason in zip(
            texts, choices, tokens, tool_calls, finish_reasons, strict=True
        )
    ]


def _tool_calls_of(message: Any) -> tuple[dict[str, Any], ...]:
    return tuple(
        {
            "id": storable(str(call.id)),
            "type": "function",
            "function": {
                "name": storable(str(call.function.name)),
                "arguments": storable(str(call.function.arguments or "")),
            },
        }
        for call in getattr(message, "tool_calls", None) or []
    )


def _plain(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    dumped = value.model_dump() if hasattr(value, "model_dump") else value
    return dumped if isinstance(dumped, dict) else None


def _in_chain(error: BaseException, *kinds: type[BaseException]) -> bool:
    """litellm wraps the real cause (a refused connection, unparsable JSON) in a server error."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, kinds):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _describe(error: Exception) -> tuple[str, int]:
    """A readable message, and the HTTP status that tells a gateway caller what happened."""
    import httpx
    import openai

    timed_out = _in_chain(error, _litellm().Timeout, openai.APITimeoutError, httpx.TimeoutException)
    if not timed_out and _in_chain(error, httpx.ConnectError, openai.APIConnectionError):
        kind, status = _UNREACHABLE, 502
    else:
        kind, status = next(
            ((label, code) for cls, label, code in _error_labels() if isinstance(error, cls)),
            ("The model call failed", 502),
        )
    detail = _NOISE.sub("", " ".join(str(getattr(error, "message", None) or error).split()))
    if len(detail) > _MAX_ERROR_CHARS:
        detail = detail[: _MAX_ERROR_CHARS - 1] + "…"
    return (f"{kind}: {detail}" if detail else kind), status


def count_tokens(text: str) -> int:
    """Tokens of a text, for the example budget. An estimate (≈4 characters a token) that
    holds across models, so the budget means the same whichever model a queue uses."""
    return max(1, (len(text) + 3) // 4)


# Characters worth about a token each rather than a quarter: digits (SmolLM2's vocabulary and
# others' split numbers into single digits) and letters outside ASCII (most vocabularies learnt
# on English split them into bytes).
_DENSE = re.compile(r"[0-9]|[^\x00-\x7f]")


def prompt_tokens(messages: Sequence[dict[str, Any]], *, tools: Any = None) -> int:
    """Tokens of a prompt, estimated as `count_tokens` does, each digit and each letter
    outside ASCII counted as a token: each message as JSON (its text, its tool calls, and its
    role and keys, which stand for the template's markers), and the tools offered (the
    server writes their definitions into the prompt)."""
    texts = [json.dumps(message, ensure_ascii=False) for message in messages]
    if tools:
        texts.append(json.dumps(tools, ensure_ascii=False))
    return sum(count_tokens(text) + len(_DENSE.findall(text)) * 3 // 4 for text in texts)


def warm_up() -> None:
    """Pay at start-up what the first real call would: litellm imports its provider code on
    its first call (~0.5 s), and the OpenAI client, which litellm calls OpenAI-compatible
    servers with, imports its API's resources when first asked for one (0.2–0.4 s, which the
    gateway's first call paid on top of its upstream). A mocked answer makes no request, so
    the client's import is done here by name."""
    complete(
        messages=[{"role": "user", "content": "warm up"}],
        model=settings.LLM_MODEL,
        params={},
        mock_response="ok",
    )
    importlib.import_module("openai.resources.chat")
