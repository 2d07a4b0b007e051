"""A model that writes its tool call as JSON in its answer (Qwen2.5-Coder: ```json … ```) is
served to the caller as a tool call, plain and streamed, through litellm's real code path
(its offline `mock_response`); the words of any other answer reach the caller unchanged."""

import json
from typing import Any

import pytest

from icrlhf.gateway.models import Call
from tests.gateway.test_foreign_tools import _ask, _client, _streamed, in_process
from tests.support.llm_answer import LLMAnswer
from tests.support.waiting import wait_for

FENCED = '```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```'


def _answer(response: Any, stream: bool) -> tuple[str, list[dict[str, Any]], str]:
    if stream:
        return _streamed(response)
    choice = response.json()["choices"][0]
    message = choice["message"]
    return message["content"] or "", message.get("tool_calls") or [], choice["finish_reason"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.urls("icrlhf.gateway.urls")
@in_process
@pytest.mark.parametrize("stream", [False, True])
def test_a_call_written_as_fenced_json_reaches_the_caller_as_a_call(
    llm_answer: LLMAnswer, stream: bool
) -> None:
    llm_answer(FENCED)
    response = _ask(_client(), stream=stream)
    assert response.status_code == 200
    text, calls, finish = _answer(response, stream)
    assert text == "" and finish == "tool_calls"
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("get_weather", {"city": "Paris"})
    ]
    row = wait_for(Call.objects.first, what="the call's log row")
    assert [c["function"]["name"] for c in row.tool_calls] == ["get_weather"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.urls("icrlhf.gateway.urls")
@in_process
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    "said",
    [
        '```json\n{"city": "Paris"}\n```',  # JSON, but not a call
        f"Calling it now:\n{FENCED}",
        "It is sunny in Paris.",
    ],
)
def test_any_other_answer_reaches_the_caller_as_words(
    llm_answer: LLMAnswer, stream: bool, said: str
) -> None:
    llm_answer(said)
    response = _ask(_client(), stream=stream)
    assert response.status_code == 200
    text, calls, finish = _answer(response, stream)
    assert (text, calls, finish) == (said, [], "stop")


@pytest.mark.django_db(transaction=True)
@pytest.mark.urls("icrlhf.gateway.urls")
@in_process
def test_without_tools_offered_a_fenced_call_is_words(llm_answer: LLMAnswer) -> None:
    llm_answer(FENCED)
    response = _ask(_client(), tools=None)
    assert response.json()["choices"][0]["message"]["content"] == FENCED
