"""Format examples: when fewer than k stored steps were made with a request's tools, a queue
that sends them fills the places left with the nearest tool calls of other tool sets, marked
as such, after the rest and within the budget, never near-duplicates; and they survive the
remote path (the store's owner answers ids, the asker re-reads and re-checks the rows).
Against the real embedder and a real Qdrant local store."""

import json
from pathlib import Path
from typing import Any

import pytest

from icrlhf.integrations import llm
from icrlhf.memory import index, remote_recall
from icrlhf.memory.models import Example
from icrlhf.memory.selectors import (
    examples_recall,
    examples_recall_anywhere,
    recall_as_json,
)
from icrlhf.memory.signatures import Signature
from tests.factories import QueueFactory, stored_example

pytestmark = pytest.mark.django_db


def _tool(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}


def tool_step(queue: Any, question: str, tool: str, **arguments: Any) -> Example:
    """A stored agent step: the question, then a call of `tool`."""
    example = stored_example(queue, input_text=question, output_text=f"{tool}(...)")
    call = {
        "id": "call_0",
        "type": "function",
        "function": {"name": tool, "arguments": json.dumps(arguments)},
    }
    example.tool_names = [tool]
    example.turns = [
        {"role": "user", "content": question},
        {"role": "assistant", "content": None, "tool_calls": [call]},
    ]
    example.save()
    return example


def indexed(*examples: Example) -> None:
    index.examples_index(example_ids=[e.pk for e in examples])


WEATHER = Signature.of(tools=[_tool("get_weather")], response_format=None)


def recalled(queue: Any, query: str, *, k: int = 3, budget: int = 10_000) -> list[tuple[str, bool]]:
    recall = examples_recall(
        queue=queue, query_text=query, k=k, token_budget=budget, signature=WEATHER
    )
    return [(r.example.tool_names[0], r.format_only) for r in recall.examples]


@pytest.fixture
def memory(vector_store: Path) -> Any:
    queue = QueueFactory(format_examples=True, min_similarity=0.4)
    indexed(
        tool_step(queue, "What is the weather in Paris today?", "get_weather", city="Paris"),
        tool_step(queue, "Book a flight to Paris for Monday.", "book_flight", to="Paris"),
        tool_step(queue, "Find hotels in Paris near the river.", "find_hotels", city="Paris"),
        tool_step(queue, "Convert 20 euros to dollars.", "convert_currency", amount=20),
    )
    return queue


def test_places_left_go_to_other_tool_sets_calls_after_the_matching_ones(memory: Any) -> None:
    found = recalled(memory, "Will it rain in Paris tomorrow?")
    assert found[0] == ("get_weather", False)  # the request's own tools come first
    assert len(found) == 3 and all(format_only for _, format_only in found[1:])
    assert {tool for tool, _ in found[1:]} <= {"book_flight", "find_hotels", "convert_currency"}


def test_off_the_queue_only_same_tool_set_steps_are_offered(memory: Any) -> None:
    memory.format_examples = False
    memory.save()
    assert recalled(memory, "Will it rain in Paris tomorrow?") == [("get_weather", False)]


def test_a_request_without_tools_gets_no_format_examples(memory: Any) -> None:
    recall = examples_recall(
        queue=memory, query_text="Will it rain in Paris tomorrow?", k=3, token_budget=10_000
    )
    assert recall.examples == []  # its tools' steps are not admitted, nor shown as format


def test_format_examples_are_never_near_duplicates_and_the_budget_cuts_them_first(
    memory: Any,
) -> None:
    # The same request stored again with another tool: a near-duplicate of the kept one.
    indexed(tool_step(memory, "What is the weather in Paris today?", "weather_api", q="Paris"))
    found = recalled(memory, "What is the weather in Paris today?", k=4)
    assert ("weather_api", True) not in found
    weather = next(
        e for e in Example.objects.filter(queue=memory) if e.tool_names == ["get_weather"]
    )
    its_tokens = llm.count_tokens(weather.input_text) + llm.count_tokens(json.dumps(weather.turns))
    assert recalled(memory, "Will it rain in Paris tomorrow?", budget=its_tokens + 5) == [
        ("get_weather", False)
    ]


def test_format_examples_survive_the_store_owners_answer(
    memory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Test double of `remote_recall.ask`: the owner's own answer, as JSON, in this process."""
    answer = recall_as_json(
        examples_recall(
            queue=memory,
            query_text="Will it rain in Paris tomorrow?",
            k=3,
            token_budget=10_000,
            signature=WEATHER,
        )
    )
    monkeypatch.setattr(remote_recall, "ask", lambda query, *, timeout_s: answer)

    def asked() -> list[tuple[str, bool]]:
        recall = examples_recall_anywhere(
            queue=memory,
            query_text="Will it rain in Paris tomorrow?",
            k=3,
            token_budget=10_000,
            signature=WEATHER,
        )
        return [(r.example.tool_names[0], r.format_only) for r in recall.examples]

    assert asked() == recalled(memory, "Will it rain in Paris tomorrow?")
    memory.format_examples = False  # the queue turned them off since: the asker drops them
    memory.save()
    assert asked() == [("get_weather", False)]


def test_a_step_that_answered_in_words_is_never_a_format_example(vector_store: Path) -> None:
    """A step made under tools whose action was prose would teach, under the format note,
    the very prose the option is there to stop."""
    queue = QueueFactory(format_examples=True, min_similarity=0.4)
    prose = tool_step(queue, "Book a flight to Paris for Monday.", "book_flight", to="Paris")
    prose.turns = [prose.turns[0], {"role": "assistant", "content": "I cannot book flights."}]
    prose.save()
    call = tool_step(queue, "Find hotels in Paris near the river.", "find_hotels", city="Paris")
    indexed(prose, call)
    assert recalled(queue, "Will it rain in Paris tomorrow?") == [("find_hotels", True)]
