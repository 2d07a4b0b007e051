"""The context window of the model a call goes to (`llm.context_window`): the endpoint's
setting, else what its server reports, else litellm's model info. The server here is a test
double of llama.cpp's `GET /props`; tests/integration/test_context_fit.py asks the real one."""

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured

from icrlhf.integrations import llm
from icrlhf.settings import llm_endpoints


class PropsServerDouble:
    """Answers GET /props as llama.cpp's server does (`n_ctx` of its default generation
    settings), or with `status`; counts the asks and keeps the last key sent."""

    def __init__(self, *, n_ctx: int, status: int = 200) -> None:
        self.n_ctx, self.status = n_ctx, status
        self.asked = 0
        self.last_authorization = ""
        double = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
                double.asked += 1
                double.last_authorization = self.headers.get("Authorization", "")
                body = json.dumps(
                    {"default_generation_settings": {"n_ctx": double.n_ctx}, "total_slots": 1}
                ).encode()
                self.send_response(double.status if self.path == "/props" else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    @property
    def api_base(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture(autouse=True)
def _nothing_reported_yet(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts as a fresh process does: no server asked yet."""
    monkeypatch.setattr(llm.windows, "_reported_windows", {})


@pytest.fixture
def llama_props() -> Iterator[PropsServerDouble]:
    server = PropsServerDouble(n_ctx=1024)
    yield server
    server.stop()


def test_the_server_is_asked_once_per_process_with_its_own_key(
    llama_props: PropsServerDouble, settings: Any
) -> None:
    settings.LLM_API_BASE, settings.LLM_API_KEY = llama_props.api_base + "/", "install-key"
    settings.LLM_CONTEXT_WINDOW = 0
    assert [llm.context_window("", "") for _ in range(3)] == [1024] * 3
    assert llm.context_window("openai/smollm2", llama_props.api_base) == 1024
    assert llama_props.asked == 1
    assert llama_props.last_authorization == "Bearer install-key"


def test_a_setting_for_the_endpoint_comes_before_the_server(
    llama_props: PropsServerDouble, settings: Any
) -> None:
    settings.LLM_API_BASE, settings.LLM_MODEL = llama_props.api_base, "openai/smollm2"
    settings.LLM_CONTEXT_WINDOW = 900
    settings.LLM_ENDPOINTS = llm_endpoints(
        json.dumps({"other": {"model": "openai/other", "api_base": llama_props.api_base}})
    )
    assert llm.context_window("", "") == 900  # the install's own: LLM_CONTEXT_WINDOW
    assert llm.context_window("openai/smollm2", llama_props.api_base) == 900
    assert llama_props.asked == 0
    # Another endpoint at the same server, without a setting: the server says.
    assert llm.context_window("openai/other", llama_props.api_base) == 1024


def test_a_named_endpoint_sets_its_own_window(settings: Any) -> None:
    settings.LLM_ENDPOINTS = llm_endpoints(
        '{"hosted": {"model": "openai/big", "api_base": "http://127.0.0.1:9/v1", '
        '"context_window": 32000}}'
    )
    assert settings.LLM_ENDPOINTS["hosted"]["context_window"] == "32000"
    assert llm.context_window("openai/big", "http://127.0.0.1:9/v1/") == 32000
    # The same address with another model is not that endpoint.
    assert llm.context_window("openai/unknown-model", "http://127.0.0.1:9/v1") is None


@pytest.mark.parametrize("window", ['"8k"', "0", "-5", "true", "1.5"])
def test_a_wrong_window_is_refused_at_start_up(window: str) -> None:
    listed = f'{{"x": {{"model": "m", "api_base": "http://h", "context_window": {window}}}}}'
    with pytest.raises(ImproperlyConfigured, match="`context_window` must be a positive number"):
        llm_endpoints(listed)


def test_without_a_report_litellm_knows_its_models_and_nothing_else(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    silent = PropsServerDouble(n_ctx=2048, status=404)  # any other OpenAI-compatible server
    try:
        settings.LLM_CONTEXT_WINDOW = 0
        known = llm.client.litellm_module().get_model_info("openai/gpt-4o-mini")["max_input_tokens"]
        assert llm.context_window("openai/gpt-4o-mini", silent.api_base) == known > 100_000
        assert llm.context_window("openai/smollm2", silent.api_base) is None
        assert silent.asked == 1  # not again at each call…
        monkeypatch.setattr(llm.windows, "_WINDOW_ASK_AGAIN_S", 0.0)
        silent.status = 200  # …but a while later: it may have been starting
        assert llm.context_window("openai/smollm2", silent.api_base) == 2048
        assert silent.asked == 2
    finally:
        silent.stop()
    # A provider's own endpoint (no base URL) is not asked: litellm knows its models.
    settings.LLM_API_BASE = ""
    assert llm.context_window("openai/smollm2", "") is None
