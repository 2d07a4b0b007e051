"""A call's cost: litellm's price for a model its price map lists, 0 for one it does not (a
local server's), which llm.py registers at no price so litellm stops searching for it."""

from icrlhf.integrations import llm
from tests.support.fixed_latency_llm import FixedLatencyLLM

_QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def test_a_model_litellm_prices_keeps_its_price(fixed_llm: FixedLatencyLLM) -> None:
    completion = llm.complete(
        messages=_QUESTION, model="openai/gpt-4o-mini", params={}, api_base=fixed_llm.api_base
    )

    # The double reports 10 prompt and 12 completion tokens; gpt-4o-mini has a listed price.
    assert completion.cost_usd > 0


def test_a_model_litellm_does_not_know_costs_nothing_and_is_registered_once(
    fixed_llm: FixedLatencyLLM,
) -> None:
    model = "openai/a-local-model-for-the-cost-test"

    first = llm.complete(messages=_QUESTION, model=model, params={}, api_base=fixed_llm.api_base)
    second = llm.complete(messages=_QUESTION, model=model, params={}, api_base=fixed_llm.api_base)

    assert (first.cost_usd, second.cost_usd) == (0.0, 0.0)
    assert llm.client.litellm_module().get_model_info(model)["input_cost_per_token"] == 0.0
    assert llm.windows.known_window(model) is None  # registering gave it no context window
