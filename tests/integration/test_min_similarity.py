"""The issue's case through the real parts (Celery worker on Redis, fastembed, Qdrant local
store, litellm over HTTP): a reviewer's test edit on one request never reaches an unrelated
one at the queue's default minimum similarity, and the item page says it was left out."""

import pytest
from django.test import Client

from icrlhf.generation.services import item_create
from icrlhf.memory.models import Example
from icrlhf.queues.models import DEFAULT_MIN_SIMILARITY, Item
from icrlhf.review.decisions import decision_record
from icrlhf.review.models import Decision
from tests.factories import QueueFactory, UserFactory
from tests.support.processes import WorkerProcess
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

TEST_EDIT = "TEST EDIT <i>please ignore</i>"


def _ready(item: Item) -> Item:
    wait_for(
        lambda: Item.objects.get(pk=item.pk).status in {Item.Status.READY, Item.Status.FAILED},
        what=f"item {item.pk} to finish generating",
    )
    item.refresh_from_db()
    return item


def test_a_test_edit_never_reaches_an_unrelated_request(
    worker_process: WorkerProcess, client: Client
) -> None:
    reviewer = UserFactory()
    # Memory candidates would offer any stored answer: only the minimum stands in the way.
    queue = QueueFactory(n_candidates=2, memory_min_similarity=0.0, members=[reviewer])
    assert queue.min_similarity == DEFAULT_MIN_SIMILARITY
    edited = _ready(
        item_create(queue=queue, input_text="How do I reset my PIN?", created_by=reviewer)
    )
    decision = decision_record(
        item_id=edited.pk,
        reviewer=reviewer,
        verdict=Decision.Verdict.EDITED,
        candidate_id=edited.generations.get().candidates.order_by("pk")[0].pk,
        final_text=TEST_EDIT,
    )
    wait_for(
        lambda: not decision.examples.exclude(index_state=Example.IndexState.INDEXED).exists(),
        what="the decision's examples to be indexed",
    )
    stored = decision.examples.get(role=Example.Role.PREFERRED)

    unrelated = _ready(
        item_create(queue=queue, input_text="My card has not arrived yet.", created_by=reviewer)
    )
    generation = unrelated.generations.get()
    assert not generation.retrievals.exists()
    assert "TEST EDIT" not in "".join(m["content"] for m in generation.messages)
    assert "TEST EDIT" not in "".join(generation.candidates.values_list("text", flat=True))
    assert generation.min_similarity == DEFAULT_MIN_SIMILARITY
    [below] = generation.below_minimum
    assert below["example"] == str(stored.pk) and below["score"] < DEFAULT_MIN_SIMILARITY

    client.force_login(reviewer)
    page = client.get(f"/items/{unrelated.pk}/").content.decode()
    assert "No stored example was similar enough to be used for this item." in page
    assert "TEST EDIT &lt;i&gt;please ignore&lt;/i&gt;" in page and "<i>please" not in page
