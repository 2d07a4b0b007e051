"""A tool call naming a tool the request did not offer never reaches the caller (a model shown
other tool sets' calls as format examples may copy one): the gateway asks the model once more,
else answers with what the model said, without the calls. Plain and streamed, in this process
with a test double of the upstream, and once through the real gateway process."""

import json
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.test import Client

from icrlhf.gateway.models import Call
from icrlhf.ingest.models import IntegrationToken
from icrlhf.ingest.services import token_create
from icrlhf.integrations import llm
from icrlhf.memory.signatures import foreign_calls
from icrlhf.queues.models import Queue
from tests.factories import QueueFactory
from tests.gateway.test_endpoint import client_for
from tests.support.fixed_latency_llm import FixedLatencyLLM
from tests.support.processes import GatewayProcess
from tests.support.waiting import wait_for

URL = "/v1/chat/completions"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
ASKED = [{"role": "user", "content": "What is the weather in Paris?"}]


def _call(name: str, arguments: dict[str, Any], number: int = 0) -> dict[str, Any]:
    return {
        "id": f"call_{number}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


OFFERED = _call("get_weather", {"city": "Paris"})
FOREIGN = _call("book_flight", {"to": "Paris"})  # another request's tool, from an example


def test_calls_to_tools_not_offered_are_found_by_name() -> None:
    assert foreign_calls([OFFERED], [WEATHER]) == []
    assert foreign_calls([OFFERED, FOREIGN], [WEATHER]) == [FOREIGN]
    assert foreign_calls([OFFERED], None) == [OFFERED]  # no tools offered: every call is foreign


class ScriptedUpstream:
    """Test double of the upstream (`llm.acomplete` and `llm.astream`): each ask gets the
    next scripted answer (text, tool calls); it counts the asks and keeps the messages of
    each."""

    def __init__(self, *answers: tuple[str, list[dict[str, Any]]]) -> None:
        self.answers = list(answers)
        self.asked = 0
        self.sent: list[list[dict[str, Any]]] = []

    def _next(self) -> tuple[str, list[dict[str, Any]]]:
        self.asked += 1
        return self.answers.pop(0)

    async def acomplete(self, *, messages: list[dict[str, Any]], **_: Any) -> llm.Completion:
        self.sent.append(messages)
        text, calls = self._next()
        return llm.Completion(
            text=text,
            model="scripted",
            prompt_tokens=10,
            completion_tokens=5,
            cost_usd=0.0,
            latency_ms=1,
            finish_reason="tool_calls" if calls else "stop",
            tool_calls=tuple(calls),
            model_prompt_ms=100.0,
            model_generation_ms=40.0,
            cached_prompt_tokens=4,
        )

    async def astream(self, *, messages: list[dict[str, Any]], **_: Any) -> llm.Stream:
        self.sent.append(messages)
        text, calls = self._next()

        async def chunks() -> AsyncIterator[Any]:
            if text:
                yield _chunk(SimpleNamespace(content=text, tool_calls=None))
            for index, call in enumerate(calls):
                function = SimpleNamespace(
                    name=call["function"]["name"], arguments=call["function"]["arguments"]
                )
                piece = SimpleNamespace(index=index, id=call["id"], function=function)
                yield _chunk(SimpleNamespace(content=None, tool_calls=[piece]))

        return llm.Stream(messages=messages, chunks=chunks())


def _chunk(delta: Any) -> Any:
    return SimpleNamespace(usage=None, choices=[SimpleNamespace(finish_reason=None, delta=delta)])


@pytest.fixture
def upstream(monkeypatch: pytest.MonkeyPatch) -> Any:
    def script(*answers: tuple[str, list[dict[str, Any]]]) -> ScriptedUpstream:
        double = ScriptedUpstream(*answers)
        monkeypatch.setattr(llm, "acomplete", double.acomplete)
        monkeypatch.setattr(llm, "astream", double.astream)
        return double

    return script


def _client(queue: Queue | None = None, name: str = "a") -> Client:
    queue = queue or QueueFactory(slug="tools")
    return Client(headers={"Authorization": f"Bearer {token_create(queue=queue, name=name)[1]}"})


def _ask(client: Client, **body: Any) -> Any:
    payload = {"model": "tools", "messages": ASKED, "tools": [WEATHER], **body}
    return client.post(URL, json.dumps(payload), content_type="application/json")


def _streamed(response: Any) -> tuple[str, list[dict[str, Any]], str]:
    """A streamed answer's text, its tool call pieces and its finish reason."""
    text, pieces, finish = "", [], ""

    async def read() -> bytes:
        return b"".join([chunk async for chunk in response.streaming_content])

    body = async_to_sync(read)().decode()
    for line in body.splitlines():
        if not line.startswith("data: {"):
            continue
        event = json.loads(line.removeprefix("data: "))
        for choice in event.get("choices", []):
            text += choice["delta"].get("content") or ""
            pieces += choice["delta"].get("tool_calls") or []
            finish = choice.get("finish_reason") or finish
    return text, pieces, finish


def _answer_without_calls(response: Any, stream: bool) -> tuple[str, list[dict[str, Any]], str]:
    """An answer's text, its tool call pieces and its finish reason, plain or streamed; a
    plain answer's message must hold no tool calls at all."""
    if stream:
        return _streamed(response)
    choice = response.json()["choices"][0]
    assert "tool_calls" not in choice["message"]
    return choice["message"]["content"], [], choice["finish_reason"]


in_process = pytest.mark.usefixtures("eager_tasks", "vector_store", "gateway_threads")


@pytest.mark.django_db(transaction=True)
@pytest.mark.urls("icrlhf.gateway.urls")
@in_process
@pytest.mark.parametrize("stream", [False, True])
def test_a_foreign_call_is_asked_again_and_the_clean_answer_served(
    upstream: Any, stream: bool
) -> None:
    double = upstream(("", [FOREIGN]), ("", [OFFERED]))
    response = _ask(_client(), stream=stream)
    assert response.status_code == 200
    if stream:
        _, pieces, finish = _streamed(response)
        assert [p["function"]["name"] for p in pieces] == ["get_weather"]
    else:
        choice = response.json()["choices"][0]
        finish = choice["finish_reason"]
        assert [c["function"]["name"] for c in choice["message"]["tool_calls"]] == ["get_weather"]
    assert finish == "tool_calls" and double.asked == 2
    # A streamed call's row is written as the stream settles, just after its last chunk.
    call = wait_for(Call.objects.first, what="the call's log row")
    assert [c["function"]["name"] for c in call.tool_calls] == ["get_weather"]
    assert call.asks == 2
    if not stream:  # the model's times of both asks, added up
        assert (call.model_prompt_ms, call.model_generation_ms) == (200, 80)
        assert (call.prompt_tokens, call.cached_prompt_tokens) == (20, 8)


@pytest.mark.django_db(transaction=True)
@pytest.mark.urls("icrlhf.gateway.urls")
@in_process
@pytest.mark.parametrize("stream", [False, True])
def test_a_foreign_call_twice_answers_with_the_models_words_alone(
    upstream: Any, stream: bool
) -> None:
    double = upstream(("Let me book that.", [OFFERED, FOREIGN]), ("", [FOREIGN]))
    response = _ask(_client(), stream=stream)
    assert response.status_code == 200
    text, pieces, finish = _answer_without_calls(response, stream)
    assert pieces == []
    assert text == "Let me book that." and finish == "stop" and double.asked == 2
    # A streamed call's row is written as the stream settles, just after its last chunk.
    call = wait_for(Call.objects.first, what="the call's log row")
    assert call.tool_calls == [] and call.answer_text == "Let me book that."


@pytest.mark.django_db(transaction=True)
@pytest.mark.urls("icrlhf.gateway.urls")
@in_process
@pytest.mark.parametrize("stream", [False, True])
def test_the_same_prompt_at_temperature_0_is_not_asked_again(upstream: Any, stream: bool) -> None:
    """No format examples to leave out, and no sampling to change the answer: asking again
    would bring the same call back and double the call's time."""
    double = upstream(("Let me check.", [FOREIGN]))
    response = _ask(_client(), stream=stream, temperature=0)
    assert response.status_code == 200
    text, pieces, finish = _answer_without_calls(response, stream)
    assert (text, pieces, finish) == ("Let me check.", [], "stop")
    assert double.asked == 1
    call = wait_for(Call.objects.first, what="the call's log row")
    assert call.asks == 1 and call.tool_calls == []


@pytest.mark.django_db(transaction=True)
@pytest.mark.urls("icrlhf.gateway.urls")
@in_process
@pytest.mark.parametrize("stream", [False, True])
def test_offered_calls_pass_at_once(upstream: Any, stream: bool) -> None:
    double = upstream(("", [OFFERED]))
    response = _ask(_client(), stream=stream)
    assert response.status_code == 200
    if stream:
        _, pieces, _ = _streamed(response)
        assert [p["function"]["name"] for p in pieces] == ["get_weather"]
    else:
        message = response.json()["choices"][0]["message"]
        assert message["tool_calls"][0]["function"]["name"] == "get_weather"
    assert double.asked == 1
    call = wait_for(Call.objects.first, what="the call's log row")
    assert call.asks == 1
    if not stream:
        assert (call.model_prompt_ms, call.model_generation_ms, call.cached_prompt_tokens) == (
            100,
            40,
            4,
        )
        assert call.waited_ms is not None and call.waited_ms >= 0


class CopyingLLM(FixedLatencyLLM):
    """The fixed-answer endpoint, except that its answer to every other ask (the first, the
    third, …) calls a tool it was never offered, as a small model copies a format example's."""

    def __init__(self) -> None:
        super().__init__(latency_s=0.01)
        self.asks = 0

    def answer(self, request: dict[str, Any]) -> dict[str, Any]:
        answer = super().answer(request)
        self.asks += 1
        message = answer["choices"][0]["message"]
        if self.asks % 2 == 1 and message.get("tool_calls"):
            message["tool_calls"][0]["function"]["name"] = "book_flight"
        return answer


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_through_the_real_gateway_no_foreign_call_reaches_the_openai_client(
    gateway_process: GatewayProcess,
) -> None:
    copying = CopyingLLM().start()
    try:
        queue = QueueFactory(api_base=copying.api_base)
        client = client_for(gateway_process, queue)
        plain = client.chat.completions.create(
            model=queue.slug,
            messages=ASKED,  # type: ignore[arg-type]
            tools=[WEATHER],  # type: ignore[list-item]
        )
        calls = plain.choices[0].message.tool_calls or []
        assert [c.function.name for c in calls] == ["get_weather"]  # type: ignore[union-attr]
        streamed = client.chat.completions.create(
            model=queue.slug,
            messages=ASKED,  # type: ignore[arg-type]
            tools=[WEATHER],  # type: ignore[list-item]
            stream=True,
        )
        names = [
            piece.function.name
            for chunk in streamed
            for choice in chunk.choices
            for piece in choice.delta.tool_calls or []
            if piece.function and piece.function.name
        ]
        assert names == ["get_weather"]
        assert copying.asks == 4  # each call asked twice: its first answer named book_flight
    finally:
        copying.stop()


@pytest.mark.django_db(transaction=True)
@pytest.mark.urls("icrlhf.gateway.urls")
@in_process
@pytest.mark.parametrize("stream", [False, True])
def test_asking_again_counts_against_the_tokens_calls_a_minute(
    upstream: Any, stream: bool, settings: Any
) -> None:
    """Each ask is a call to the upstream: a call asked twice uses two of the minute's."""
    settings.GATEWAY_REQUESTS_PER_MINUTE = 2
    double = upstream(("", [FOREIGN]), ("", [OFFERED]))
    client = _client()
    first = _ask(client, stream=stream)
    if stream:
        _streamed(first)  # read to its end: the ask again happens as the stream ends
    assert first.status_code == 200 and double.asked == 2
    refused = _ask(client, stream=stream)
    assert refused.status_code == 429 and double.asked == 2
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"


@pytest.mark.django_db(transaction=True)
@pytest.mark.urls("icrlhf.gateway.urls")
@in_process
@pytest.mark.parametrize("stream", [False, True])
def test_with_no_call_left_this_minute_a_foreign_call_is_not_asked_again(
    upstream: Any, stream: bool, settings: Any
) -> None:
    settings.GATEWAY_REQUESTS_PER_MINUTE = 1
    double = upstream(("Let me book that.", [FOREIGN]))
    response = _ask(_client(), stream=stream)
    assert response.status_code == 200
    text, pieces, finish = _answer_without_calls(response, stream)
    assert (text, pieces, finish) == ("Let me book that.", [], "stop")
    assert double.asked == 1  # the token's minute was spent by the call itself


# What app A's end users and tools said: none of it may reach app B's prompt or answer.
A_WORDS = ("Book a flight to Paris", "Booking it.", "Booked AF123.", '"to": "Paris"')


@pytest.mark.django_db(transaction=True)
@pytest.mark.urls("icrlhf.gateway.urls")
@in_process
@pytest.mark.parametrize(
    ("source", "b_gets_the_form"),
    [
        (Queue.FormatExamples.QUEUE, True),
        (Queue.FormatExamples.TOKEN, False),
        (Queue.FormatExamples.OFF, False),
    ],
)
@pytest.mark.parametrize("framing", [Queue.ExampleFraming.REFERENCE, Queue.ExampleFraming.TURNS])
def test_a_token_offering_unseen_tools_never_receives_another_tokens_words(
    upstream: Any, source: str, b_gets_the_form: bool, framing: str
) -> None:
    """Two tokens of one queue: app A's steps are memory; app B calls with a tool set none
    of them used. Shared by every token, B's prompt shows the form of A's call and nothing
    else of it; from each token's own calls, or off, none of A's examples at all."""
    from tests.memory.test_format_examples import token_step

    queue = QueueFactory(slug="tools", format_examples_from=source, example_framing=framing)
    _client(queue, name="app A")
    token_a = IntegrationToken.objects.get(name="app A")
    a_step = token_step(queue, token_a, "Book a flight to Paris for Monday.", "book_flight")
    double = upstream(("", [OFFERED]))
    response = _ask(_client(queue, name="app B"))
    assert response.status_code == 200
    prompt = json.dumps(double.sent)
    answer = response.content.decode() + json.dumps(dict(response.headers))
    assert not any(words in prompt + answer for words in A_WORDS)
    assert ("book_flight" in prompt) is b_gets_the_form
    assert (str(a_step.pk) in response["X-Icrlhf-Examples"]) is b_gets_the_form


@pytest.mark.django_db(transaction=True)
@pytest.mark.urls("icrlhf.gateway.urls")
@in_process
@pytest.mark.parametrize("stream", [False, True])
def test_a_foreign_call_is_asked_again_without_the_format_examples(
    upstream: Any, stream: bool
) -> None:
    """At temperature 0 the same prompt brings the copied call back: the second ask leaves
    out the format examples (another tool set's call), and keeps the rest of the prompt."""
    from tests.memory.test_format_examples import token_step

    queue = QueueFactory(slug="tools", format_examples_from=Queue.FormatExamples.QUEUE)
    _client(queue, name="app A")
    token_step(
        queue,
        IntegrationToken.objects.get(name="app A"),
        "Book a flight to Paris for Monday.",
        "book_flight",
    )
    double = upstream(("", [FOREIGN]), ("", [OFFERED]))
    # At temperature 0 too: the prompt changes.
    response = _ask(_client(queue, name="app B"), stream=stream, temperature=0)
    assert response.status_code == 200
    if stream:
        _streamed(response)
    first, again = (json.dumps(sent) for sent in double.sent)
    assert "book_flight" in first and "book_flight" not in again
    assert "What is the weather in Paris?" in again
    # The same system prompt, short of the forms shown after it.
    assert double.sent[0][0]["content"].startswith(double.sent[1][0]["content"])
