"""The one place that talks to language models (through litellm).

litellm is imported on first use, not at import: the web process imports this module (through
the services) but never calls a model, and litellm costs seconds and ~150 MB to load.
"""

import json
import os
import re
import time
from dataclasses import dataclass
from functools import cache
from types import ModuleType
from typing import Any

from django.conf import settings

# Sampling parameters a queue may set; anything else in its params is ignored, so a queue
# cannot smuggle provider options (base URLs, keys, mock switches) into the call.
SAMPLING_PARAMS = frozenset(
    {"temperature", "top_p", "max_tokens", "seed", "stop", "presence_penalty", "frequency_penalty"}
)
_MAX_ERROR_CHARS = 400
# litellm prefixes its messages with class names ("litellm.InternalServerError: Internal…").
_NOISE = re.compile(r"^(?:litellm\.\w+: |\w+Error: |\w*Exception - )+")


class LLMError(Exception):
    """A failed LLM call, with a message fit to show a reviewer."""


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


@cache
def _litellm() -> ModuleType:
    # Without this, litellm fetches a price list from the internet at import.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    litellm.suppress_debug_info = True
    litellm.telemetry = False
    return litellm


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
def _error_labels() -> tuple[tuple[type[Exception], str], ...]:
    # Most specific first: several of litellm's errors subclass others (Timeout is a
    # connection error, a context-window error is a bad request).
    litellm = _litellm()
    return (
        (litellm.Timeout, "The model did not answer in time"),
        (litellm.RateLimitError, "The model is rate-limited"),
        (litellm.APIConnectionError, "The model could not be reached"),
        (litellm.ServiceUnavailableError, "The model's server is unavailable"),
        (litellm.BadGatewayError, "The model's server is unavailable"),
        (litellm.InternalServerError, "The model's server failed"),
        (litellm.AuthenticationError, "The model rejected the API key"),
        (litellm.NotFoundError, "The model was not found"),
        (litellm.ContextWindowExceededError, "The prompt is too long for the model"),
        (litellm.BadRequestError, "The model rejected the request"),
    )


def sampling_params(params: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in params.items() if key in SAMPLING_PARAMS}


def complete(
    *,
    messages: list[dict[str, str]],
    model: str,
    params: dict[str, Any],
    api_base: str = "",
    mock_response: str | None = None,
) -> Completion:
    """One chat completion. `mock_response` is litellm's own offline switch, for tests."""
    litellm = _litellm()
    started = time.monotonic()
    extra: dict[str, Any] = {} if mock_response is None else {"mock_response": mock_response}
    try:
        response = litellm.completion(
            model=model,
            messages=messages,
            api_base=api_base or settings.LLM_API_BASE or None,
            api_key=settings.LLM_API_KEY or None,
            timeout=settings.LLM_TIMEOUT_S,
            num_retries=0,  # Celery owns the retries, with backoff and a cap.
            **sampling_params(params),
            **extra,
        )
    except _transient_errors() as error:
        if _in_chain(error, json.JSONDecodeError):
            # A 200 whose body is not JSON: a misconfigured endpoint, not a passing fault.
            raise PermanentLLMError("The model's answer could not be read: not JSON.") from error
        raise TransientLLMError(_describe(error)) from error
    except Exception as error:  # litellm raises many types; all others are permanent.
        raise PermanentLLMError(_describe(error)) from error
    latency_ms = int((time.monotonic() - started) * 1000)
    return _completion_from(response, model=model, latency_ms=latency_ms)


def _completion_from(response: Any, *, model: str, latency_ms: int) -> Completion:
    try:
        content = response.choices[0].message.content
    except (AttributeError, IndexError, TypeError) as error:
        raise PermanentLLMError("The model's answer had no message in it.") from error
    if isinstance(content, str):
        # An answer is untrusted text: PostgreSQL cannot store NUL, and no reader needs one.
        content = content.replace("\x00", "")
    if not isinstance(content, str) or not content.strip():
        raise PermanentLLMError("The model returned an empty answer.")
    usage = getattr(response, "usage", None)
    # litellm prices the call itself; unknown models (local ones) have no price.
    hidden = getattr(response, "_hidden_params", None) or {}
    return Completion(
        text=content.strip(),
        model=str(getattr(response, "model", None) or model),
        prompt_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
        completion_tokens=int(getattr(usage, "completion_tokens", 0) or 0),
        cost_usd=float(hidden.get("response_cost") or 0.0),
        latency_ms=latency_ms,
    )


def _in_chain(error: BaseException, *kinds: type[BaseException]) -> bool:
    """litellm wraps the real cause (a refused connection, unparsable JSON) in a server error."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, kinds):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _describe(error: Exception) -> str:
    import httpx
    import openai

    timed_out = _in_chain(error, _litellm().Timeout, openai.APITimeoutError, httpx.TimeoutException)
    if not timed_out and _in_chain(error, httpx.ConnectError, openai.APIConnectionError):
        kind = "The model could not be reached"
    else:
        kind = next(
            (label for cls, label in _error_labels() if isinstance(error, cls)),
            "The model call failed",
        )
    detail = _NOISE.sub("", " ".join(str(getattr(error, "message", None) or error).split()))
    if len(detail) > _MAX_ERROR_CHARS:
        detail = detail[: _MAX_ERROR_CHARS - 1] + "…"
    return f"{kind}: {detail}" if detail else kind


def count_tokens(text: str) -> int:
    """Tokens of a text, for the example budget. An estimate (≈4 characters a token) that
    holds across models, so the budget means the same whichever model a queue uses."""
    return max(1, (len(text) + 3) // 4)


def warm_up() -> None:
    """litellm imports its provider code on the first call (~0.5 s): pay that at start-up."""
    complete(
        messages=[{"role": "user", "content": "warm up"}],
        model=settings.LLM_MODEL,
        params={},
        mock_response="ok",
    )
