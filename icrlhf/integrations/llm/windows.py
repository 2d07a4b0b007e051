"""A model's context window: the one its server reports (asked once a minute at most), else
the one litellm knows."""

import logging
import threading
import time
from functools import cache

from django.conf import settings

from icrlhf.integrations.llm.client import litellm_module
from icrlhf.integrations.llm.named_endpoints import api_key_for, endpoint_named, endpoints

logger = logging.getLogger(__name__)


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
    return _server_window(api_base or settings.LLM_API_BASE) or known_window(model)


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
def known_window(model: str) -> int | None:
    """The prompt tokens litellm's model list gives a model it knows (OpenAI's, Anthropic's…)."""
    try:
        info = litellm_module().get_model_info(model)
    except Exception:  # litellm raises a bare Exception for a model it does not know
        return None
    window = info.get("max_input_tokens")
    return window if isinstance(window, int) and window > 0 else None
