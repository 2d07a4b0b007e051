"""The one place that talks to language models (through litellm).

litellm is imported on first use, not at import: the web process imports this module (through
the services) but never calls a model, and litellm costs seconds and ~150 MB to load.
"""

import asyncio
import concurrent.futures
import importlib
import logging
import os
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from icrlhf.integrations.llm.client import (
    SAMPLING_PARAMS,
    call_options,
    extra_options,
    litellm_module,
    register_if_unlisted,
    sampling_params,
)
from icrlhf.integrations.llm.errors import (
    LLMError,
    PermanentLLMError,
    TransientLLMError,
    error_summary,
    failure,
    in_chain,
)
from icrlhf.integrations.llm.named_endpoints import NO_KEY, api_key_for, endpoint_named, endpoints
from icrlhf.integrations.llm.replies import Completion, completion_from, completions_from
from icrlhf.integrations.llm.streams import Stream, astream
from icrlhf.integrations.llm.tokens import count_tokens, prompt_tokens
from icrlhf.integrations.llm.windows import context_window
from icrlhf.integrations.text_tool_calls import offered_tools

# The package's API: callers use `llm.<name>`; each module's docstring says what it holds.
__all__ = [
    "NO_KEY",
    "SAMPLING_PARAMS",
    "Arrived",
    "Call",
    "Completion",
    "LLMError",
    "PermanentLLMError",
    "Stream",
    "TransientLLMError",
    "acomplete",
    "acomplete_n",
    "api_key_for",
    "astream",
    "complete",
    "complete_n",
    "context_window",
    "count_tokens",
    "endpoint_named",
    "endpoints",
    "error_summary",
    "prompt_tokens",
    "sampling_params",
    "warm_up",
]

logger = logging.getLogger(__name__)


def complete(
    *,
    messages: list[dict[str, Any]],
    model: str,
    params: dict[str, Any],
    api_base: str = "",
    response_format: dict[str, Any] | None = None,
    options: dict[str, Any] | None = None,
    mock_response: str | None = None,
) -> Completion:
    """One chat completion. `options`: a caller's tool and output fields, passed on as they
    are (a replayed agent step's tools). `mock_response` is litellm's own offline switch, for
    tests."""
    litellm = litellm_module()
    register_if_unlisted(model)
    started = time.monotonic()
    extra = extra_options(mock_response)
    try:
        response = litellm.completion(
            model=model,
            messages=messages,
            **(call_options(params, api_base, response_format) | (options or {})),
            **extra,
        )
    except Exception as error:  # litellm raises many types: sorted by failure.
        raise failure(error) from error
    latency_ms = int((time.monotonic() - started) * 1000)
    return completion_from(
        response, model=model, latency_ms=latency_ms, offered=offered_tools(options)
    )


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
    return completion_from(
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
    return completions_from(
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
    litellm = litellm_module()
    register_if_unlisted(model)
    started = time.monotonic()
    try:
        response = await litellm.acompletion(
            model=model,
            messages=messages,
            **asked,
            **(call_options(params, api_base, response_format) | (options or {})),
            **extra_options(mock_response),
        )
    except Exception as error:
        raise failure(error) from error
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
    if in_chain(error, litellm_module().UnsupportedParamsError):
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
