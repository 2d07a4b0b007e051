"""LiteLLM's proxy, the gateway's yardstick: the same upstream behind the most used open
gateway, which does no retrieval at all.

It lives in a virtualenv of its own (`make loadgen` installs `litellm[proxy]` there, at the
version the product pins, so its dependencies never meet the product's). It is configured as
its docs tell a user to: a config file naming the model, a master key that callers
authenticate with, offline mode (no catalog fetched at start-up), one worker, as the gateway
runs. Its spend logs would need a database, and LiteLLM reaches one only through Prisma,
whose engines are downloaded from Prisma's own servers, which an offline install cannot
reach: it runs without one, which only makes it faster."""

import json
from importlib.metadata import version
from pathlib import Path

from icrlhf.ops.stack import Stack, free_port, http_ok, wait_until

MASTER_KEY = "sk-bench-litellm"
MODEL = "bench"


def proxy_path() -> Path:
    """Where `make loadgen` installs the proxy's command."""
    return (
        Path.home()
        / ".cache"
        / "icrlhf"
        / f"litellm-proxy-{version('litellm')}"
        / "bin"
        / "litellm"
    )


def start(stack: Stack, *, upstream_api_base: str, upstream_model: str, folder: Path) -> str:
    """The proxy in front of the upstream, once it answers; returns its API base URL."""
    command = proxy_path()
    if not command.exists():
        raise RuntimeError(f"LiteLLM's proxy is not installed at {command}: run `make loadgen`.")
    config = {
        "model_list": [
            {
                "model_name": MODEL,
                "litellm_params": {
                    "model": upstream_model,
                    "api_base": upstream_api_base,
                    "api_key": "unused",
                },
            }
        ],
        "general_settings": {"master_key": MASTER_KEY},
    }
    path = folder / "litellm-config.json"
    path.write_text(json.dumps(config))  # YAML's superset: LiteLLM reads it as its config
    port = free_port()
    stack.spawn(
        "litellm-proxy",
        [str(command), "--config", str(path), "--host", "127.0.0.1", "--port", str(port)],
        env={"LITELLM_OFFLINE_MODE": "true", "LITELLM_LOG": "ERROR"},
        unset=("DATABASE_URL",),
    )
    base = f"http://127.0.0.1:{port}"
    wait_until(lambda: http_ok(f"{base}/health/liveliness"), timeout_s=120, what="LiteLLM's proxy")
    return f"{base}/v1"
