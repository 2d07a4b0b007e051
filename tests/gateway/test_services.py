"""What answers a gateway call (gateway/services.py): what retrieval looks for, which calls
are held out, and the plan for the model (the queue's limits over the caller's parameters,
the prompt without memory's examples for a held-out call). Capture is in test_capture.py,
the endpoint in test_views.py and test_endpoint.py."""

from typing import Any

import pytest

from icrlhf.gateway import services
from icrlhf.gateway.models import Call
from icrlhf.gateway.schemas import ChatRequest
from icrlhf.memory import index
from tests.factories import QueueFactory, stored_example

pytestmark = pytest.mark.django_db


def chat(*messages: dict[str, Any], **fields: Any) -> ChatRequest:
    return ChatRequest.model_validate({"model": "q", "messages": list(messages), **fields})


USER = {"role": "user", "content": "Book a table for two tonight."}
CALL = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "book", "arguments": "{}"}}
    ],
}
RESULT = {"role": "tool", "tool_call_id": "c1", "content": "No table at 8; one at 9."}


def test_retrieval_looks_for_the_last_words_or_after_a_tool_result_the_goal_and_the_result() -> (
    None
):
    assert services.decision_point(chat(USER)) == "Book a table for two tonight."
    # An agent decides from where it stands: its goal and the latest observation.
    assert services.decision_point(chat(USER, CALL, RESULT)) == (
        "Book a table for two tonight.\n\nNo table at 8; one at 9."
    )


def test_the_calls_of_one_run_share_one_draw_of_the_holdout() -> None:
    queue = QueueFactory(holdout_percent=50)
    draws = {key: services.held_out(queue=queue, run_key=key) for key in map(str, range(400))}
    # Each run is all held out or all served, whichever call of it asks.
    assert all(services.held_out(queue=queue, run_key=key) == out for key, out in draws.items())
    assert 150 < sum(draws.values()) < 250  # about half of the runs
    queue.holdout_percent = 0
    assert not any(services.held_out(queue=queue, run_key=key) for key in draws)
    queue.holdout_percent = 100
    assert all(services.held_out(queue=queue, run_key=key) for key in draws)


def test_the_queues_answer_length_caps_the_callers(vector_store: Any, eager_tasks: None) -> None:
    queue = QueueFactory(max_tokens=100, temperature=0.3, holdout_percent=0)
    plan = services.call_plan(queue=queue, request=chat(USER, max_tokens=5000, top_p=0.5))
    assert plan.memory_answer is None and plan.memory == Call.Memory.EMPTY
    assert plan.params == {"temperature": 0.3, "max_tokens": 100, "top_p": 0.5}
    assert plan.messages[-1] == {"role": "user", "content": "Book a table for two tonight."}


def test_a_held_out_call_is_retrieved_for_but_its_prompt_carries_no_example(
    vector_store: Any, eager_tasks: None
) -> None:
    queue = QueueFactory(holdout_percent=100)
    stored_example(queue, input_text="Book a table for two tonight.", output_text="Booked.")
    index.examples_index(example_ids=list(queue.examples.values_list("pk", flat=True)))
    plan = services.call_plan(queue=queue, request=chat(USER))
    # Coverage is measured alike, so the two arms compare; the caller is told nothing.
    assert plan.holdout and plan.top_score is not None and plan.top_score > 0.9
    assert plan.examples == [] and plan.memory_answer is None
    assert plan.served_memory == Call.Memory.EMPTY
    assert "Booked." not in str(plan.messages)
