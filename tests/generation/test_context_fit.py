"""The review worker fits its prompt to the model's window, as the gateway does, and records
as retrieved only the examples it sent. The window is the endpoint's setting
(LLM_CONTEXT_WINDOW); retrieval runs against the real embedder and a local store. The real
server's own window: tests/integration/test_context_fit.py."""

from pathlib import Path
from typing import Any

import pytest

from icrlhf.generation import pipeline
from icrlhf.generation.context import Room
from icrlhf.generation.models import Generation
from icrlhf.generation.prompts import examples_sent
from icrlhf.generation.services import item_create
from icrlhf.memory import index
from tests.factories import stored_example

pytestmark = pytest.mark.django_db

STORED = 6


def prepared(queue: Any, user: Any) -> Generation:
    item = item_create(queue=queue, input_text="My card has not arrived yet.", created_by=user)
    pipeline.generation_prepare(generation_id=item.generations.get().pk)
    return Generation.objects.get(item=item)


def test_a_generation_sends_and_records_only_the_examples_that_fit(
    queue: Any, user: Any, vector_store: Path, settings: Any
) -> None:
    queue.k_examples, queue.example_token_budget, queue.max_tokens = STORED, 20_000, 64
    queue.save()
    stored = [
        stored_example(
            queue,
            input_text=f"My card {n} has not arrived yet, what now?",
            output_text=f"Answer {n}:" + " Freeze it in the app and order a new one." * 8,
        )
        for n in range(STORED)
    ]
    index.examples_index(example_ids=[example.pk for example in stored])

    settings.LLM_CONTEXT_WINDOW = 0  # unknown (the test model's server is nowhere): all go
    whole = prepared(queue, user)
    assert whole.retrievals.count() == len(examples_sent(whole.messages)) == STORED

    settings.LLM_CONTEXT_WINDOW = 600
    fitted = prepared(queue, user)
    sent = examples_sent(fitted.messages)
    recorded = list(fitted.retrievals.order_by("rank"))
    assert 0 < len(sent) == len(recorded) < STORED
    assert [r.rank for r in recorded] == list(range(1, len(sent) + 1))  # the most similar
    assert [e.output_text for e in sent] == [r.example.output_text for r in reversed(recorded)]
    assert Room(window=600, answer_tokens=64).fits(fitted.messages)
