"""Tools through the gateway, as agents use them: OpenAI's own client and LangGraph's ReAct
agent (its own tool loop, unchanged) against the real gateway process, plain and streamed,
with the fixed-latency endpoint as the upstream (it calls the first tool it is offered, then
answers with the tool's result)."""

import json
from typing import Any

import litellm
import pytest
from django.test import Client

from icrlhf.gateway.models import Call
from icrlhf.ingest.services import token_create
from icrlhf.memory.models import Example
from icrlhf.queues.models import Item, Queue
from tests.factories import QueueFactory, UserFactory
from tests.gateway.test_endpoint import CARD, client_for, decided_in_workbench
from tests.support.fixed_latency_llm import FixedLatencyLLM
from tests.support.processes import GatewayProcess
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

ORDER_TOOL = {
    "type": "function",
    "function": {
        "name": "look_up_order",
        "description": "Find an order by what the customer says about it.",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string"}},
            "required": ["query"],
        },
        "strict": True,
    },
}
QUESTION = "Where is order 1234?"


def test_a_tool_loop_plain_and_streamed_through_the_openai_client(
    gateway_process: GatewayProcess, fixed_llm: FixedLatencyLLM
) -> None:
    queue = QueueFactory()
    client = client_for(gateway_process, queue)
    asked = [{"role": "user", "content": QUESTION}]

    first = client.chat.completions.create(
        model=queue.slug,
        messages=asked,
        tools=[ORDER_TOOL],
        tool_choice="auto",
        parallel_tool_calls=False,
        seed=7,
        stop=["\n\n"],
        user="customer-42",
        metadata={"run": "r1"},
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls or []
    assert call.function.name == "look_up_order"
    assert json.loads(call.function.arguments) == {"query": QUESTION}
    sent = fixed_llm.last_request
    assert sent["tools"][0]["function"]["name"] == "look_up_order"
    assert sent["tools"][0]["function"]["strict"] is True
    assert (sent["tool_choice"], sent["parallel_tool_calls"]) == ("auto", False)
    assert (sent["seed"], sent["stop"]) == (7, ["\n\n"])
    # `user` goes to litellm, which passes it to the providers it knows take it (OpenAI's own
    # models); for a custom OpenAI-compatible endpoint it drops it (BerriAI/litellm#25753).

    # The application runs the tool and sends its result back: the next step answers it.
    result = {"role": "tool", "tool_call_id": call.id, "content": "Shipped on Monday."}
    turns = [*asked, choice.message.model_dump(exclude_none=True), result]
    second = client.chat.completions.create(model=queue.slug, messages=turns, tools=[ORDER_TOOL])
    assert second.choices[0].finish_reason == "stop"
    assert "tool result Shipped on Monday." in (second.choices[0].message.content or "")
    upstream_turns = fixed_llm.last_request["messages"]
    assert upstream_turns[-2]["tool_calls"][0]["id"] == call.id  # the turns, as they were
    assert upstream_turns[-1] == {
        "role": "tool",
        "content": "Shipped on Monday.",
        **{"tool_call_id": call.id},
    }

    # Streamed: the tool call arrives as OpenAI's deltas, its arguments in pieces.
    chunks = list(
        client.chat.completions.create(
            model=queue.slug, messages=asked, tools=[ORDER_TOOL], stream=True
        )
    )
    deltas = [d for c in chunks if c.choices for d in (c.choices[0].delta.tool_calls or [])]
    assert deltas[0].id and deltas[0].function and deltas[0].function.name == "look_up_order"
    arguments = "".join(d.function.arguments or "" for d in deltas if d.function)
    assert json.loads(arguments) == {"query": QUESTION}
    assert len(deltas) >= 3
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"

    wait_for(lambda: queue.calls.count() == 3, what="three calls logged")
    logged = queue.calls.filter(stream=True).get()
    assert "look_up_order" in logged.answer_text
    assert not queue.calls.exclude(capture=Call.Capture.NONE).exists()


def test_litellm_as_the_applications_client_gets_tool_calls_plain_and_streamed(
    gateway_process: GatewayProcess, fixed_llm: FixedLatencyLLM
) -> None:
    queue = QueueFactory()
    _, token = token_create(queue=queue, name="litellm-app")
    options: dict[str, Any] = {
        "model": f"openai/{queue.slug}",
        "api_base": gateway_process.base_url,
        "api_key": token,
        "messages": [{"role": "user", "content": QUESTION}],
        "tools": [ORDER_TOOL],
    }
    answer = litellm.completion(**options)
    (call,) = answer.choices[0].message.tool_calls
    assert answer.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "look_up_order"
    assert json.loads(call.function.arguments) == {"query": QUESTION}

    chunks = list(litellm.completion(**options, stream=True))
    pieces = [d for c in chunks for d in (c.choices[0].delta.tool_calls or [])]
    assert pieces[0].function.name == "look_up_order"
    assert json.loads("".join(p.function.arguments or "" for p in pieces)) == {"query": QUESTION}


def test_structured_output_and_logprobs_pass_through(
    gateway_process: GatewayProcess, fixed_llm: FixedLatencyLLM
) -> None:
    queue = QueueFactory()
    schema = {
        "name": "answer",
        "strict": True,
        "schema": {"type": "object", "properties": {"text": {"type": "string"}}},
    }
    client_for(gateway_process, queue).chat.completions.create(
        model=queue.slug,
        messages=[{"role": "user", "content": QUESTION}],
        response_format={"type": "json_schema", "json_schema": schema},
        logprobs=True,
        top_logprobs=2,
    )
    sent = fixed_llm.last_request
    assert sent["response_format"] == {"type": "json_schema", "json_schema": schema}
    assert (sent["logprobs"], sent["top_logprobs"]) == (True, 2)


def test_a_memory_answer_is_never_replayed_to_a_call_that_offers_tools(
    gateway_process: GatewayProcess, fixed_llm: FixedLatencyLLM
) -> None:
    queue = QueueFactory(n_candidates=2, memory_candidates=0, memory_answer_threshold=0.9)
    client = client_for(gateway_process, queue)
    preferred = decided_in_workbench(queue, CARD).examples.get(role=Example.Role.PREFERRED)
    plain = client.chat.completions.with_raw_response.create(
        model=queue.slug, messages=[{"role": "user", "content": CARD}]
    )
    assert plain.headers["X-Icrlhf-Source"] == "memory"

    calls_before = fixed_llm.calls
    with_tools = client.chat.completions.with_raw_response.create(
        model=queue.slug, messages=[{"role": "user", "content": CARD}], tools=[ORDER_TOOL]
    )
    assert with_tools.headers["X-Icrlhf-Source"] == "model"
    assert with_tools.parse().choices[0].message.tool_calls
    structured = client.chat.completions.with_raw_response.create(
        model=queue.slug,
        messages=[{"role": "user", "content": CARD}],
        response_format={"type": "json_object"},
    )
    assert structured.headers["X-Icrlhf-Source"] == "model"
    assert fixed_llm.calls == calls_before + 2
    assert preferred.output_text not in (structured.parse().choices[0].message.content or "")


@pytest.mark.parametrize("streaming", [False, True], ids=["plain", "streamed"])
def test_langgraphs_react_agent_runs_its_tool_loop_through_the_gateway(
    gateway_process: GatewayProcess, streaming: bool
) -> None:
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from langgraph.prebuilt import create_react_agent

    looked_up: list[str] = []

    @tool
    def look_up_order(query: str) -> str:
        """Find an order by what the customer says about it."""
        looked_up.append(query)
        return "Shipped on Monday."

    queue = QueueFactory()
    client = client_for(gateway_process, queue)
    model = ChatOpenAI(
        model=queue.slug,
        base_url=gateway_process.base_url,
        api_key=client.api_key,
        streaming=streaming,
        max_retries=0,
    )
    agent: Any = create_react_agent(model, [look_up_order])
    state = agent.invoke({"messages": [("user", QUESTION)]})

    assert looked_up == [QUESTION]  # the agent's own loop ran the tool the gateway relayed
    kinds = [message.type for message in state["messages"]]
    assert kinds == ["human", "ai", "tool", "ai"]
    assert "tool result Shipped on Monday." in state["messages"][-1].content
    wait_for(lambda: queue.calls.count() == 2, what="both steps logged")
    assert set(queue.calls.values_list("stream", flat=True)) == {streaming}


def test_a_reviewed_tool_call_reaches_the_next_similar_steps_prompt_as_openai_turns(
    gateway_process: GatewayProcess, fixed_llm: FixedLatencyLLM
) -> None:
    """Captured with its tools, generated again with them, picked by a reviewer, stored with
    its signature: the next similar step gets it as turns; no call lacking its tool does, and
    no call is ever answered with it from memory."""
    queue = QueueFactory(
        n_candidates=2,
        memory_candidates=0,
        capture_percent=100,
        memory_answer_threshold=0.0,
        # A call lacking the step's tool gets no format example either.
        format_examples_from=Queue.FormatExamples.OFF,
    )
    client = client_for(gateway_process, queue)
    system = {"role": "system", "content": "You are the shop's order assistant."}
    served = client.chat.completions.create(
        model=queue.slug,
        messages=[system, {"role": "user", "content": QUESTION}],
        tools=[ORDER_TOOL],
    )
    assert served.choices[0].message.tool_calls

    # The capture's other candidate answers the same conversation with the same tools.
    wait_for(
        lambda: Item.objects.filter(queue=queue, status=Item.Status.READY).exists(),
        what="the captured step's candidates",
    )
    item = Item.objects.get(queue=queue)
    assert item.call_options["tools"][0]["function"]["name"] == "look_up_order"
    generated = fixed_llm.last_request
    assert generated["tools"][0]["function"]["name"] == "look_up_order"
    assert (
        "The application's instructions:\nYou are the shop's order assistant."
        in (generated["messages"][0]["content"])
    )
    assert generated["messages"][-1] == {"role": "user", "content": QUESTION}
    candidates = list(item.generations.get().candidates.order_by("position"))
    assert all(c.tool_calls[0]["function"]["name"] == "look_up_order" for c in candidates)

    reviewer = UserFactory()
    queue.members.add(reviewer)
    browser = Client()
    browser.force_login(reviewer)
    page = browser.get(f"/items/{item.pk}/").content.decode()
    assert "Calls 1 tool" in page and "look_up_order" in page
    browser.post(f"/items/{item.pk}/decide/", {"choice": f"c{candidates[0].pk}"})
    example = Example.objects.get(queue=queue, role=Example.Role.PREFERRED)
    assert example.tool_names == ["look_up_order"]
    assert [t["role"] for t in example.turns] == ["user", "assistant"]
    assert example.turns[-1]["tool_calls"] == candidates[0].tool_calls
    wait_for(
        lambda: (
            Example.objects.filter(queue=queue, index_state=Example.IndexState.INDEXED).count() == 2
        ),
        what="the examples indexed",
    )

    similar = "Where is my order 1235?"
    client.chat.completions.create(
        model=queue.slug, messages=[{"role": "user", "content": similar}], tools=[ORDER_TOOL]
    )
    sent = fixed_llm.last_request["messages"]
    stored_call = candidates[0].tool_calls[0]
    assert sent[1:] == [
        {"role": "user", "content": QUESTION},
        {  # (litellm leaves out an empty content)
            "role": "assistant",
            "tool_calls": [{**stored_call, "id": f"example1_{stored_call['id']}"}],
        },
        {
            "role": "tool",
            "tool_call_id": f"example1_{stored_call['id']}",
            "content": "",
        },
        {"role": "user", "content": similar},
    ]

    # That call was captured too: its candidates (the worker's calls, with the example in
    # their prompts) must be done before the endpoint's latest request is read again.
    wait_for(
        lambda: (
            Item.objects.filter(queue=queue).count() == 2
            and not Item.objects.filter(
                queue=queue, status__in=[Item.Status.NEW, Item.Status.GENERATING]
            ).exists()
        ),
        what="the second capture's candidates",
    )
    other_tool = {"type": "function", "function": {**ORDER_TOOL["function"], "name": "refund"}}
    for tools in ([other_tool], None):
        kwargs: dict[str, Any] = {"tools": tools} if tools else {}
        answer = client.chat.completions.with_raw_response.create(
            model=queue.slug, messages=[{"role": "user", "content": QUESTION}], **kwargs
        )
        assert answer.headers["X-Icrlhf-Source"] == "model"  # never the stored tool call
        assert all(
            "tool_calls" not in m and m["role"] != "tool"
            for m in fixed_llm.last_request["messages"]
        )
