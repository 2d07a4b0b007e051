"""The endpoints a deployment names (LLM_ENDPOINTS): their keys, and a model's name at each."""

from django.conf import settings

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
