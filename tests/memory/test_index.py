"""Indexing (memory/index.py) against the real embedder (fastembed) and a real Qdrant local
store; retrieval is in test_selectors.py."""

from pathlib import Path
from typing import Any

import pytest
from django.conf import LazySettings

from icrlhf.integrations import vectors
from icrlhf.memory import index
from icrlhf.memory.models import Example
from icrlhf.memory.selectors import examples_recall
from tests.factories import decided_and_indexed

pytestmark = pytest.mark.django_db


def test_indexing_stores_every_example_under_its_own_id(
    queue: Any, user: Any, vector_store: Path
) -> None:
    examples = decided_and_indexed(
        queue, user, "Where is my card?", "It ships in 3 days.", "No idea."
    )
    assert {e.index_state for e in Example.objects.all()} == {"indexed"}
    assert all(e.embedding_model.startswith("all-MiniLM-L6-v2") for e in Example.objects.all())
    assert vectors.count(collection=index.collection_of(queue.pk)) == len(examples) == 2
    # Indexing again is a no-op for indexed rows and idempotent for the store.
    assert index.examples_index(example_ids=[e.pk for e in examples]) == 0


def test_a_decision_made_while_the_store_is_down_is_kept_and_indexed_later(
    queue: Any, user: Any, vector_store: Path, settings: LazySettings
) -> None:
    settings.QDRANT_URL = "http://127.0.0.1:9"  # a Qdrant server that is down
    vectors.close()
    with pytest.raises(vectors.VectorStoreUnavailable):
        decided_and_indexed(
            queue, user, "My card has not arrived yet.", "It ships in 3 days.", "Dunno."
        )
    examples = Example.objects.all()
    assert examples.count() == 2  # the decision and its examples are saved
    assert {e.index_state for e in examples} == {"failed"}
    assert "unavailable" in examples[0].index_error

    settings.QDRANT_URL = ""  # the store is back
    vectors.close()
    pending = index.examples_unindexed()
    assert sorted(pending) == sorted(str(e.pk) for e in examples)
    assert index.examples_index(example_ids=pending) == 2
    assert index.examples_unindexed() == []
    recall = examples_recall(queue=queue, query_text="Where is my card?", k=5, token_budget=10_000)
    assert [r.example.output_text for r in recall.examples] == ["It ships in 3 days."]
