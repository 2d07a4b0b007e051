"""The queue's minimum similarity at the gateway: an example below it neither answers a call
from memory nor reaches its prompt. Retrieval goes the gateway's way (a task to the process
that owns the embedded store, run inline here) against the real embedder and a local store."""

import json
from typing import Any

import pytest

from icrlhf.gateway import services
from icrlhf.gateway.models import Call
from icrlhf.gateway.schemas import ChatRequest
from icrlhf.memory import index
from icrlhf.memory.models import Example
from icrlhf.memory.selectors import examples_recall_anywhere
from icrlhf.queues.models import Queue
from tests.factories import QueueFactory, stored_example

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("eager_tasks", "vector_store")]

CARD_AGAIN = "I still haven't received my card"  # cosine 0.39 to PIN
PIN = "How do I reset my PIN?"
TEST_EDIT = "TEST EDIT, please ignore"


def queue_remembering_a_test_edit(**fields: Any) -> tuple[Queue, Example]:
    queue = QueueFactory(memory_answer_threshold=0.2, **fields)
    example = stored_example(queue, input_text=PIN, output_text=TEST_EDIT)
    index.examples_index(example_ids=[example.pk])
    return queue, example


def plan_for(queue: Queue, text: str) -> services.Plan:
    request = ChatRequest.model_validate(
        {"model": queue.slug, "messages": [{"role": "user", "content": text}]}
    )
    return services.call_plan(queue=queue, request=request)


def test_an_example_below_the_minimum_neither_answers_nor_reaches_the_prompt() -> None:
    queue, _ = queue_remembering_a_test_edit(min_similarity=0.5)
    plan = plan_for(queue, CARD_AGAIN)
    assert plan.memory_answer is None and plan.source == Call.Source.MODEL
    assert plan.examples == [] and plan.memory == Call.Memory.EMPTY
    assert TEST_EDIT not in json.dumps(plan.messages)


def test_the_same_example_above_another_queues_minimum_answers_from_memory() -> None:
    queue, example = queue_remembering_a_test_edit(min_similarity=0.2)
    plan = plan_for(queue, CARD_AGAIN)
    assert plan.memory_answer == TEST_EDIT and plan.source == Call.Source.MEMORY
    assert [r.example.pk for r in plan.examples] == [example.pk]


def test_recall_through_the_stores_owner_says_what_fell_below_the_minimum() -> None:
    queue, example = queue_remembering_a_test_edit(min_similarity=0.5)
    recall = examples_recall_anywhere(
        queue=queue, query_text=CARD_AGAIN, k=5, token_budget=10_000, pool=3
    )
    assert recall.examples == [] and recall.neighbours == []
    assert [r.example.pk for r in recall.below_minimum] == [example.pk]
    assert recall.minimum == 0.5


def test_where_the_queue_asks_only_an_approved_example_answers_from_memory(user: Any) -> None:
    """Answers served with no one reviewing them: a curator approves each example first.
    Unapproved, it still reaches the prompt; an edit withdraws the approval."""
    from icrlhf.memory import curation

    queue, example = queue_remembering_a_test_edit(
        min_similarity=0.2, memory_answers_need_approval=True
    )
    plan = plan_for(queue, CARD_AGAIN)
    assert plan.memory_answer is None and plan.source == Call.Source.MODEL
    assert TEST_EDIT in json.dumps(plan.messages)  # still an example in the prompt

    assert curation.examples_approve(ids=[example.pk], approved=True, actor=user) == 1
    assert plan_for(queue, CARD_AGAIN).memory_answer == TEST_EDIT

    curation.example_output_edit(example_id=example.pk, output_text="Edited.", actor=user)
    example.refresh_from_db()
    assert example.approved_for_answers_at is None
