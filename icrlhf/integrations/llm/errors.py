"""A failed call as the product reads it: transient (retried) or permanent, with a message
fit for a reviewer and the HTTP status a gateway caller is told."""

import json
import re
from functools import cache

from icrlhf.integrations.llm.client import litellm_module

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


@cache
def _transient_errors() -> tuple[type[Exception], ...]:
    """Errors that may pass on their own: worth a retry with backoff."""
    litellm = litellm_module()
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
    litellm = litellm_module()
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


def failure(error: Exception) -> LLMError:
    if isinstance(error, LLMError):
        return error
    transient = isinstance(error, _transient_errors())
    if transient and in_chain(error, json.JSONDecodeError):
        # A 200 whose body is not JSON: a misconfigured endpoint, not a passing fault.
        return PermanentLLMError("The model's answer could not be read: not JSON.")
    message, status = _describe(error)
    return (TransientLLMError if transient else PermanentLLMError)(message, status=status)


def in_chain(error: BaseException, *kinds: type[BaseException]) -> bool:
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

    timed_out = in_chain(
        error, litellm_module().Timeout, openai.APITimeoutError, httpx.TimeoutException
    )
    if not timed_out and in_chain(error, httpx.ConnectError, openai.APIConnectionError):
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
