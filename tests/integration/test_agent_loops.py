"""Memory never teaches a loop or a placeholder, shown with an agent framework's own loop:
LangGraph's prebuilt ReAct agent, through langchain-openai, against the real gateway process,
the real worker (retrieval, indexing) and the real local model (llama.cpp with SmolLM2).

Before: memory held a reviewed step that looked an order up again after the lookup's result;
an agent retrieved it at every step and called the same tool until its framework stopped it,
and a model answered a customer with the "(result not recorded)" written after an example's
call whose result was not stored."""

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from threading import Thread
from typing import Any

import pytest
from django.conf import settings
from django.test import Client
from django.utils import timezone

from bench.world import database_url_of
from icrlhf.gateway.models import Call
from icrlhf.generation.prompts import PromptExample, messages_build
from icrlhf.ingest.services import token_create
from icrlhf.memory.models import Example
from icrlhf.memory.selectors import examples_recall_anywhere
from icrlhf.memory.signatures import Signature
from icrlhf.trajectories.models import Trajectory
from icrlhf.trajectories.services import RunOwner, run_hashes, step_record
from tests.factories import QueueFactory, UserFactory
from tests.integration.test_real_llm import local_llm  # noqa: F401  (the module's LLM server)
from tests.support.processes import GatewayProcess, WorkerProcess
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.llm, pytest.mark.django_db(transaction=True)]

QUESTION = "Where is order 1234?"
RESULT = "Order 1234 shipped on Monday."
PLACEHOLDER = "not recorded"  # of the placeholder the gateway used to write, "(result not …)"
ORDER_TOOL = {
    "type": "function",
    "function": {
        "name": "look_up_order",
        "description": "Look an order up by its number.",
        "parameters": {
            "type": "object",
            "properties": {"order_id": {"type": "string"}},
            "required": ["order_id"],
        },
    },
}


class RecordingProxy:
    """Passes every request on to the model's server as it is, and keeps the chat requests:
    the prompts the gateway sent. A streamed answer is passed on whole, once it has ended."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.removesuffix("/v1")
        self.prompts: list[dict[str, Any]] = []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self._relay(None)

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path.endswith("/chat/completions"):
                    proxy.prompts.append(json.loads(body))
                self._relay(body)

            def _relay(self, body: bytes | None) -> None:
                request = urllib.request.Request(
                    proxy.upstream + self.path,
                    data=body,
                    headers={} if body is None else {"Content-Type": "application/json"},
                )
                try:
                    with urllib.request.urlopen(request, timeout=120) as answer:
                        status, headers, data = answer.status, answer.headers, answer.read()
                except urllib.error.HTTPError as error:
                    status, headers, data = error.code, error.headers, error.read()
                self.send_response(status)
                self.send_header("Content-Type", headers.get("Content-Type", ""))
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        Thread(target=self._server.serve_forever, daemon=True).start()

    @property
    def api_base(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture(scope="module")
def recorded_llm(local_llm: str) -> Iterator[RecordingProxy]:  # noqa: F811
    proxy = RecordingProxy(local_llm)
    yield proxy
    proxy.stop()


@pytest.fixture(scope="module")
def slow_model_gateway(
    worker_process: WorkerProcess,
    recorded_llm: RecordingProxy,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[GatewayProcess]:
    """The real gateway as the session's (`gateway_process`), with time for the real model
    on a busy machine: the session's waits 3 s for a test double."""
    folder = tmp_path_factory.mktemp("gateway-real-llm")
    gateway = GatewayProcess(
        env={
            "LLM_API_BASE": recorded_llm.api_base,
            "LLM_TIMEOUT_S": "120",
            "DATABASE_URL": database_url_of(settings.DATABASES["default"]),
            "GATEWAY_RECALL_TIMEOUT_S": "10",
        },
        log=folder / "gateway.log",
    )
    try:
        gateway.wait_ready()
        yield gateway
    finally:
        gateway.stop()


def _call(call_id: str, order: str = "1234") -> dict[str, Any]:
    arguments = json.dumps({"order_id": order})
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": "look_up_order", "arguments": arguments},
    }


def _step(
    queue: Any,
    messages: list[dict[str, Any]],
    decision_point: str,
    *,
    call: dict[str, Any] | None = None,
    text: str = "",
) -> Any:
    """A step as the gateway records it for an agent's call (`call_plan`'s decision point)."""
    return step_record(
        queue=queue,
        owner=RunOwner(token_id=None, end_user=""),
        key="",
        messages=messages,
        hashes=run_hashes(messages=messages, answer_text=text, tool_calls=[call] if call else []),
        decision_point=decision_point,
        action_text=text,
        tool_calls=[call] if call else [],
        tool_names=["look_up_order"],
        call_id=None,
        created_at=timezone.now(),
    )


def _reviewed_run(queue: Any, *, order: str, result: str, then_answer: bool) -> Trajectory:
    """A run that looked an order up and got the result, then answered the customer
    (`then_answer`) or looked the same order up again; a reviewer said it succeeded, and the
    queue's reward rule stored both steps as preferred."""
    question = f"Where is order {order}?"
    asked = [{"role": "user", "content": question}]
    first = _step(queue, asked, question, call=_call("call_0", order))
    answered = [
        *asked,
        {"role": "assistant", "content": None, "tool_calls": [_call("call_0", order)]},
        {"role": "tool", "tool_call_id": "call_0", "content": result},
    ]
    after_result = f"{question}\n\n{result}"
    if then_answer:
        _step(queue, answered, after_result, text=result)
    else:
        _step(queue, answered, after_result, call=_call("call_1", order))
    reviewer = UserFactory()
    queue.members.add(reviewer)
    browser = Client()
    browser.force_login(reviewer)
    trajectory = first.trajectory
    browser.post(f"/q/{queue.slug}/trajectories/{trajectory.pk}/outcome", {"outcome": "succeeded"})
    return trajectory


def test_an_agents_own_loop_is_taught_no_loop_and_no_placeholder(
    slow_model_gateway: GatewayProcess, recorded_llm: RecordingProxy
) -> None:
    """Memory holds the reviewed step that looks the order up again, and a reviewed run that
    answered its customer after the lookup. After the result, the first is the nearest step
    (it was made at this very decision point) and is left out; the second shows the answer.
    Given the looping step (before), the agent looked the order up until LangGraph's limit;
    given no example at that point, SmolLM2 also repeats the call it sees in its own turns,
    so an example of what follows a result is what ends its loop."""
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from langgraph.errors import GraphRecursionError
    from langgraph.prebuilt import create_react_agent

    queue = QueueFactory(
        model="openai/smollm2",
        api_base=recorded_llm.api_base,
        temperature=0.0,
        max_tokens=60,
        reward_threshold=0.5,
        capture_percent=0,
        system_prompt="You are the shop's order assistant. Answer in one sentence.",
    )
    # The step that looks order 1234 up again after its result, and a run that answered its
    # customer after the lookup: what an agent should learn at that point.
    looping = _reviewed_run(queue, order="1234", result=RESULT, then_answer=False)
    _reviewed_run(queue, order="5678", result="Order 5678 shipped on Friday.", then_answer=True)
    wait_for(
        lambda: (
            Example.objects.filter(
                queue=queue, role=Example.Role.PREFERRED, index_state=Example.IndexState.INDEXED
            ).count()
            == 4
        ),
        what="both runs' steps in memory",
    )
    loop = Example.objects.get(step__trajectory=looping, step__position=1)
    assert [turn["role"] for turn in loop.turns] == ["user", "assistant", "tool", "assistant"]

    looked_up: list[str] = []

    @tool
    def look_up_order(order_id: str) -> str:
        """Look an order up by its number."""
        looked_up.append(order_id)
        return RESULT

    model = ChatOpenAI(
        model=queue.slug,
        base_url=slow_model_gateway.base_url,
        api_key=token_create(queue=queue, name="agent")[1],
        temperature=0.0,
        max_retries=0,
    )
    agent: Any = create_react_agent(model, [look_up_order])
    recorded_llm.prompts.clear()
    try:
        # At most three model turns with two tool rounds between them.
        state = agent.invoke({"messages": [("user", QUESTION)]}, {"recursion_limit": 5})
    except GraphRecursionError:
        pytest.fail(f"The agent kept calling the tool: {looked_up}")

    # The reviewed step's first lookup taught the call; nothing taught it again.
    assert 1 <= len(looked_up) <= 2, looked_up
    answer = state["messages"][-1]
    assert answer.type == "ai" and not answer.tool_calls
    assert PLACEHOLDER not in str(answer.content)

    prompts = [json.dumps(prompt) for prompt in recorded_llm.prompts]
    assert prompts and all(PLACEHOLDER not in prompt for prompt in prompts)
    # After the lookup's result, memory still finds the step that looks it up again (this
    # is the decision point it was made at), and never puts it in the prompt.
    calls = list(Call.objects.filter(queue=queue).order_by("created_at"))
    assert len(calls) == len(looked_up) + 1
    after_result = calls[1].request_text
    recall = examples_recall_anywhere(
        queue=queue,
        query_text=after_result,
        k=queue.k_examples,
        token_budget=queue.example_token_budget,
        signature=Signature.of(tools=[ORDER_TOOL], response_format=None, after_tool_result=True),
    )
    assert loop.pk in [hit.example.pk for hit in recall.examples]
    assert all(str(loop.pk) not in [e["id"] for e in call.examples] for call in calls)


def test_the_local_server_takes_an_examples_call_answered_with_nothing(
    local_llm: str,  # noqa: F811
) -> None:
    """A step whose result was not stored ends at its call, answered by an empty tool
    message (OpenAI refuses a call left unanswered): llama.cpp's server takes it, the model
    has no placeholder to copy, and the step still teaches the call."""
    step = PromptExample(
        QUESTION,
        "look_up_order",
        (
            {"role": "user", "content": QUESTION},
            {"role": "assistant", "content": None, "tool_calls": [_call("call_0")]},
        ),
    )
    messages = messages_build(
        system_prompt="You are the shop's order assistant.",
        playbook="",
        playbook_version=None,
        examples=[step],
        request="Where is order 1299?",
    )
    assert messages[3] == {"role": "tool", "tool_call_id": "example1_call_0", "content": ""}
    body = {
        "model": "smollm2",
        "messages": messages,
        "tools": [ORDER_TOOL],
        "max_tokens": 40,
        "temperature": 0,
    }
    request = urllib.request.Request(
        f"{local_llm}/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        answer = json.load(response)
    choice = answer["choices"][0]
    assert PLACEHOLDER not in json.dumps(choice)
    # Ended at its call, the example still teaches the call, with the new request's order.
    assert choice["finish_reason"] == "tool_calls", choice
    called = choice["message"]["tool_calls"][0]["function"]
    assert (called["name"], json.loads(called["arguments"])) == (
        "look_up_order",
        {"order_id": "1299"},
    )
