"""How litellm is called: imported on first use, the model registered when litellm does not
know it, the options every call carries, and the sampling parameters a queue may set."""

import os
from functools import cache
from types import ModuleType
from typing import Any

from django.conf import settings

from icrlhf.integrations.llm.named_endpoints import api_key_for

# Sampling parameters a queue may set; anything else in its params is ignored, so a queue
# cannot smuggle provider options (base URLs, keys, mock switches) into the call.
SAMPLING_PARAMS = frozenset(
    {"temperature", "top_p", "max_tokens", "seed", "stop", "presence_penalty", "frequency_penalty"}
)


@cache
def litellm_module() -> ModuleType:
    # Without this, litellm fetches a price list from the internet at import.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    litellm.suppress_debug_info = True
    litellm.telemetry = False
    return litellm


@cache
def register_if_unlisted(model: str) -> None:
    """Registers a model litellm's price map lacks (a local server's) at no price, once per
    process. litellm prices every call: an unlisted model sent its cost calculator searching
    the map and its fallbacks a dozen times a call before giving up, 0.3-0.4 ms of the ~2.9 ms
    of CPU a call took against a local 0-latency server; registered, the search stops at
    once. A model the map lists keeps its price; an unlisted one costs 0, as before."""
    litellm = litellm_module()
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


def sampling_params(params: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in params.items() if key in SAMPLING_PARAMS}


def extra_options(mock_response: str | None) -> dict[str, Any]:
    return {} if mock_response is None else {"mock_response": mock_response}


def call_options(
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
