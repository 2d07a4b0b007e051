"""The default local model (`make run` serves it) against llama.cpp's real server: a request
with tools is answered with a call the product reads (Qwen2.5-Coder writes its calls as fenced
JSON, which llama.cpp's parser leaves as words), plainly and streamed, through litellm's real
code path. The rest of the LLM tier runs the smallest model, for speed (tests/settings.py)."""

import json
from collections.abc import Iterator
from typing import Any

import pytest
from asgiref.sync import async_to_sync

from icrlhf.integrations import llm
from icrlhf.ops.catalogue import DEFAULT_LOCAL_MODEL, local_model
from tests.support.local_llm import local_llm_server

pytestmark = [pytest.mark.integration, pytest.mark.llm]

MODEL = local_model(DEFAULT_LOCAL_MODEL)
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


@pytest.fixture(scope="module")
def default_llm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with local_llm_server(
        DEFAULT_LOCAL_MODEL, log_dir=tmp_path_factory.mktemp("default-llm"), slots=2
    ) as api_base:
        yield api_base


def _asked(api_base: str) -> dict[str, Any]:
    return {
        "messages": [{"role": "user", "content": "What is the weather in Paris right now?"}],
        "model": f"openai/{MODEL.alias}",
        "params": {"temperature": 0.0, "max_tokens": 80},
        "api_base": api_base,
        "options": {"tools": [WEATHER]},
    }


def _called(calls: Any) -> list[tuple[str, Any]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


def test_the_default_model_calls_an_offered_tool_and_the_call_is_read(default_llm: str) -> None:
    answer = async_to_sync(llm.acomplete)(**_asked(default_llm))
    assert answer.finish_reason == "tool_calls", answer.text
    assert answer.text == ""
    assert _called(answer.tool_calls) == [("get_weather", {"city": "Paris"})]


def test_streamed_the_call_arrives_as_a_call_and_never_as_words(default_llm: str) -> None:
    async def streamed() -> tuple[list[dict[str, Any]], llm.Stream]:
        stream = await llm.astream(**_asked(default_llm))
        return [piece async for piece in stream], stream

    pieces, stream = async_to_sync(streamed)()
    assert not [piece for piece in pieces if piece.get("content")], pieces
    assert stream.finish_reason == "tool_calls"
    assert _called(stream.tool_calls) == [("get_weather", {"city": "Paris"})]


def test_without_tools_the_default_model_answers_in_words(default_llm: str) -> None:
    asked = _asked(default_llm) | {"options": None}
    asked["messages"] = [{"role": "user", "content": "Say hello to a customer in one sentence."}]
    answer = async_to_sync(llm.acomplete)(**asked)
    assert answer.text and not answer.tool_calls and answer.finish_reason in {"stop", "length"}
