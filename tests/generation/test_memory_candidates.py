"""Memory candidates: the preferred answers of near-identical stored requests are offered as
the first candidates, without LLM calls (real embedder and Qdrant local store)."""

from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from icrlhf.generation import pipeline
from icrlhf.generation.models import Candidate, Generation
from icrlhf.generation.services import item_create
from icrlhf.memory import index as memory_index
from icrlhf.memory.models import Example
from icrlhf.queues.models import Item
from icrlhf.review.decisions import decision_record
from tests.factories import ItemFactory, ready_generation

pytestmark = pytest.mark.django_db


def remember(queue: Any, user: Any, question: str, answer: str) -> None:
    item = ItemFactory(queue=queue, input_text=question)
    generation = ready_generation(item, [answer, "a rejected answer"])
    decision = decision_record(
        item_id=item.pk,
        reviewer=user,
        verdict="chosen",
        candidate_id=generation.candidates.get(text=answer).pk,
    )
    memory_index.examples_index(example_ids=[e.pk for e in decision.examples.all()])


def prepared(queue: Any, user: Any, question: str, n: int) -> tuple[Generation, list[int]]:
    item = item_create(queue=queue, input_text=question, created_by=user, n_candidates=n)
    generation = item.generations.get()
    enqueued = pipeline.generation_prepare(generation_id=generation.pk)
    generation.refresh_from_db()
    return generation, enqueued


def test_a_near_match_offers_its_answer_first_without_an_llm_call(
    queue: Any, user: Any, vector_store: Path
) -> None:
    queue.memory_candidates, queue.memory_min_similarity = 2, 0.8
    queue.save()
    remember(queue, user, "My card has not arrived yet.", "It ships in 3 days.")
    remember(queue, user, "My card has not arrived yet!", "It ships in 3 days.")  # same answer
    remember(queue, user, "How do I reset my PIN?", "Use the app.")  # not similar enough
    generation, enqueued = prepared(queue, user, "My card has not arrived yet.", n=3)
    first, *others = generation.candidates.order_by("pk")
    assert (first.source, first.status, first.text) == ("memory", "done", "It ships in 3 days.")
    assert first.source_example is not None
    assert first.source_example.output_text == "It ships in 3 days."
    assert first.source_example.role == Example.Role.PREFERRED
    assert [c.source for c in others] == ["llm", "llm"]  # one distinct answer only
    assert enqueued == [c.pk for c in others]


def test_when_memory_answers_every_candidate_the_item_is_ready_at_once(
    queue: Any, user: Any, vector_store: Path, logged_in: Client
) -> None:
    queue.memory_candidates, queue.memory_min_similarity = 2, 0.5
    queue.save()
    remember(queue, user, "My card has not arrived yet.", "It ships in 3 days.")
    remember(queue, user, "My new card still has not arrived.", "Check the tracking link.")
    generation, enqueued = prepared(queue, user, "My card has not arrived yet?", n=2)
    assert enqueued == []
    assert {c.source for c in generation.candidates.all()} == {"memory"}
    assert generation.status == Generation.Status.DONE
    assert Item.objects.get(pk=generation.item_id).status == Item.Status.READY
    page = logged_in.get(f"/items/{generation.item_id}/").content.decode()
    assert page.count("from memory") == 2


def test_no_memory_candidates_when_the_queue_offers_none(
    queue: Any, user: Any, vector_store: Path
) -> None:
    queue.memory_candidates = 0
    queue.save()
    remember(queue, user, "My card has not arrived yet.", "It ships in 3 days.")
    generation, enqueued = prepared(queue, user, "My card has not arrived yet.", n=2)
    assert {c.source for c in generation.candidates.all()} == {Candidate.Source.LLM}
    assert len(enqueued) == 2


def test_memory_candidates_come_from_neighbours_beyond_the_prompts_k(
    queue: Any, user: Any, vector_store: Path
) -> None:
    # The nearest requests share one answer; a distinct one is further away than k = 1.
    queue.k_examples, queue.memory_candidates, queue.memory_min_similarity = 1, 2, 0.5
    queue.save()
    remember(queue, user, "My card has not arrived yet.", "It ships in 3 days.")
    remember(queue, user, "My card still has not arrived yet.", "It ships in 3 days.")
    remember(queue, user, "My new card has not arrived.", "Check the tracking link.")
    generation, _ = prepared(queue, user, "My card has not arrived yet.", n=3)
    assert generation.retrievals.count() == 1  # the prompt keeps its k
    memory = [c.text for c in generation.candidates.order_by("pk") if c.source == "memory"]
    assert memory == ["It ships in 3 days.", "Check the tracking link."]
