"""Where a call's time went, as the model's server reports it: llama.cpp adds `timings` to
its answer (the prompt read, the answer written), and OpenAI's usage counts cached tokens."""

from types import SimpleNamespace
from typing import Any

import pytest

from icrlhf.integrations import llm
from icrlhf.integrations.llm.replies import completion_from
from tests.support.fixed_latency_llm import FixedLatencyLLM


def test_the_servers_times_reach_the_completion(fixed_llm: FixedLatencyLLM) -> None:
    completion = llm.complete(
        messages=[{"role": "user", "content": "Hello"}],
        model="openai/a-local-model",
        params={},
        api_base=fixed_llm.api_base,
    )
    assert (completion.model_prompt_ms, completion.model_generation_ms) == (3.0, 7.0)


def _response(**extra: Any) -> Any:
    message = SimpleNamespace(content="Hello.", tool_calls=None)
    choice = SimpleNamespace(message=message, finish_reason="stop", logprobs=None)
    usage = SimpleNamespace(
        prompt_tokens=30,
        completion_tokens=5,
        prompt_tokens_details=SimpleNamespace(cached_tokens=extra.pop("cached", None)),
    )
    return SimpleNamespace(choices=[choice], usage=usage, model="m", **extra)


def test_cached_prompt_tokens_are_counted() -> None:
    completion = completion_from(_response(cached=24), model="m", latency_ms=1)
    assert completion.cached_prompt_tokens == 24


@pytest.mark.parametrize(
    "timings",
    [
        None,
        "fast",
        {"prompt_ms": "12", "predicted_ms": None},
        {"prompt_ms": -1, "predicted_ms": float("nan")},
        {"prompt_ms": True, "predicted_ms": 1e12},
    ],
)
def test_a_server_without_times_or_with_nonsense_has_none(timings: Any) -> None:
    completion = completion_from(_response(timings=timings, cached=10**12), model="m", latency_ms=1)
    assert (completion.model_prompt_ms, completion.model_generation_ms) == (None, None)
    assert completion.cached_prompt_tokens == 0
