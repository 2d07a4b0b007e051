"""Format examples: when fewer than k stored steps were made with a request's tools, a queue
that sends them fills the places left with the nearest tool calls of other tool sets, marked
as such, after the rest and within the budget, never near-duplicates; only from the calls the
queue shares with the asking token (its own, or every token's); and they survive the remote
path (the store's owner answers ids, the asker re-reads and re-checks the rows). Against the
real embedder and a real Qdrant local store."""

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
from icrlhf.queues.models import Queue
from tests.factories import QueueFactory, agent_step, stored_example

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
    queue = QueueFactory(format_examples_from=Queue.FormatExamples.QUEUE, min_similarity=0.4)
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
    memory.format_examples_from = Queue.FormatExamples.OFF
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
    # The queue turned them off since: the asker drops them.
    memory.format_examples_from = Queue.FormatExamples.OFF
    memory.save()
    assert asked() == [("get_weather", False)]


def test_a_step_that_answered_in_words_is_never_a_format_example(vector_store: Path) -> None:
    """A step made under tools whose action was prose would teach, under the format note,
    the very prose the option is there to stop."""
    queue = QueueFactory(format_examples_from=Queue.FormatExamples.QUEUE, min_similarity=0.4)
    prose = tool_step(queue, "Book a flight to Paris for Monday.", "book_flight", to="Paris")
    prose.turns = [prose.turns[0], {"role": "assistant", "content": "I cannot book flights."}]
    prose.save()
    call = tool_step(queue, "Find hotels in Paris near the river.", "find_hotels", city="Paris")
    indexed(prose, call)
    assert recalled(queue, "Will it rain in Paris tomorrow?") == [("find_hotels", True)]


def test_a_step_whose_results_follow_its_call_is_a_format_example(vector_store: Path) -> None:
    """A rewarded step keeps its tool results after its action: the action is its last
    assistant turn, not its last turn."""
    queue = QueueFactory(format_examples_from=Queue.FormatExamples.QUEUE)
    step = tool_step(queue, "Book a flight to Paris for Monday.", "book_flight", to="Paris")
    step.turns = [*step.turns, {"role": "tool", "tool_call_id": "call_0", "content": "AF123"}]
    step.save()
    indexed(step)
    assert recalled(queue, "Will it rain in Paris tomorrow?") == [("book_flight", True)]


def token_step(queue: Queue, token: Any, question: str, tool: str) -> Example:
    """A preferred example learnt from a step of `token`'s run: the end user's question, the
    action's words and its call with a value, and the tool's result."""
    call = {
        "id": "call_0",
        "type": "function",
        "function": {"name": tool, "arguments": json.dumps({"to": "Paris"})},
    }
    asked = {"role": "user", "content": question}
    recorded = agent_step(
        queue, [asked], tool_calls=[call], tool_names=[tool], token=token, key=question
    )
    example = Example.objects.create(
        queue=queue,
        step=recorded.step,
        role=Example.Role.PREFERRED,
        input_text=question,
        output_text=f"{tool}(...)",
        reward=1.0,
        tool_names=[tool],
        turns=[
            asked,
            {"role": "assistant", "content": "Booking it.", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_0", "content": "Booked AF123."},
        ],
    )
    indexed(example)
    return example


def captured_call_example(queue: Queue, token: Any, question: str, tool: str) -> Example:
    """A preferred example learnt from a reviewer's decision on `token`'s captured call."""
    from icrlhf.gateway.models import Call

    example = tool_step(queue, question, tool, to="Paris")
    item = example.decision.item  # type: ignore[union-attr]
    Call.objects.create(
        queue=queue, token=token, source="model", memory="empty", request_text=question, item=item
    )
    indexed(example)
    return example


@pytest.mark.parametrize(
    ("source", "b_sees_a", "a_sees_its_own"),
    [
        (Queue.FormatExamples.QUEUE, True, True),
        (Queue.FormatExamples.TOKEN, False, True),
        (Queue.FormatExamples.OFF, False, False),
    ],
)
def test_two_tokens_share_format_examples_only_as_the_queue_says(
    vector_store: Path, source: str, b_sees_a: bool, a_sees_its_own: bool
) -> None:
    from icrlhf.ingest.services import token_create

    queue = QueueFactory(format_examples_from=source, min_similarity=0.4)
    token_a, _ = token_create(queue=queue, name="app A")
    token_b, _ = token_create(queue=queue, name="app B")
    a_examples = {
        token_step(queue, token_a, "Book a flight to Paris for Monday.", "book_flight").pk,
        captured_call_example(queue, token_a, "Find hotels in Paris.", "find_hotels").pk,
    }

    def formats_for(token: Any) -> set[Any]:
        recall = examples_recall(
            queue=queue,
            query_text="Will it rain in Paris tomorrow?",
            k=3,
            token_budget=10_000,
            signature=WEATHER,
            token_id=token.pk,
        )
        assert all(r.format_only for r in recall.examples)
        return {r.example.pk for r in recall.examples}

    assert formats_for(token_b) == (a_examples if b_sees_a else set())
    assert formats_for(token_a) == (a_examples if a_sees_its_own else set())


def test_the_asker_drops_another_tokens_format_examples_from_the_owners_answer(
    vector_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Test double of `remote_recall.ask`: an owner's answer computed for token A reaches a
    call of token B (an owner that mixed up its asks): the asker re-checks whose calls they
    were and keeps none of them."""
    from icrlhf.ingest.services import token_create

    queue = QueueFactory(format_examples_from=Queue.FormatExamples.TOKEN, min_similarity=0.4)
    token_a, _ = token_create(queue=queue, name="app A")
    token_b, _ = token_create(queue=queue, name="app B")
    token_step(queue, token_a, "Book a flight to Paris for Monday.", "book_flight")
    ask = {
        "queue": queue,
        "query_text": "Will it rain in Paris tomorrow?",
        "k": 3,
        "token_budget": 10_000,
        "signature": WEATHER,
    }
    answer = recall_as_json(examples_recall(**ask, token_id=token_a.pk))
    assert len(answer["examples"]) == 1
    monkeypatch.setattr(remote_recall, "ask", lambda query, *, timeout_s: answer)
    assert len(examples_recall_anywhere(**ask, token_id=token_a.pk).examples) == 1
    assert examples_recall_anywhere(**ask, token_id=token_b.pk).examples == []


def test_a_captured_calls_review_takes_its_tokens_format_examples() -> None:
    """Candidates for a captured call are generated under its token (the format examples
    its calls get); an item typed or imported has no token."""
    from icrlhf.gateway.models import Call
    from icrlhf.generation.selectors import item_token_id
    from icrlhf.ingest.services import token_create
    from icrlhf.queues.models import Item
    from tests.factories import ItemFactory

    queue = QueueFactory()
    token, _ = token_create(queue=queue, name="app A")
    captured = ItemFactory(queue=queue, source=Item.Source.GATEWAY)
    Call.objects.create(
        queue=queue, token=token, source="model", memory="empty", request_text="x", item=captured
    )
    assert item_token_id(item=captured) == token.pk
    assert item_token_id(item=ItemFactory(queue=queue)) is None
