"""The core loop through the real parts: Celery worker on Redis, litellm over HTTP, fastembed,
Qdrant local store. Decide on A; the generation for a paraphrase of A remembers it."""

from typing import Any

import pytest
from django.test import Client

from icrlhf.generation.models import Candidate, Generation
from icrlhf.generation.prompts import examples_sent
from icrlhf.generation.services import item_create
from icrlhf.memory.models import Example
from icrlhf.queues.models import Item
from icrlhf.review.decisions import decision_record
from icrlhf.review.models import Decision
from tests.factories import QueueFactory, UserFactory
from tests.support.processes import WorkerProcess
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def _ready(item: Item, timeout_s: float = 30) -> Item:
    wait_for(
        lambda: Item.objects.get(pk=item.pk).status in {Item.Status.READY, Item.Status.FAILED},
        timeout_s=timeout_s,
        what=f"item {item.pk} to finish generating",
    )
    item.refresh_from_db()
    return item


def test_a_decision_is_retrieved_into_the_next_similar_generation(
    worker_process: WorkerProcess,
) -> None:
    queue = QueueFactory(n_candidates=4, k_examples=3)
    reviewer = UserFactory()

    item_a = _ready(
        item_create(
            queue=queue,
            input_text="My new card has not arrived yet. Where is it?",
            created_by=reviewer,
        )
    )
    assert item_a.status == Item.Status.READY
    candidates = list(item_a.generations.get().candidates.all())
    assert [c.status for c in candidates] == [Candidate.Status.DONE] * 4
    assert len({c.text for c in candidates}) == 4

    chosen, *rejected = candidates
    decision = decision_record(
        item_id=item_a.pk,
        reviewer=reviewer,
        verdict=Decision.Verdict.CHOSEN,
        candidate_id=chosen.pk,
    )
    wait_for(
        lambda: not decision.examples.exclude(index_state=Example.IndexState.INDEXED).exists(),
        what="the decision's examples to be indexed",
    )

    item_b = _ready(
        item_create(
            queue=queue,
            input_text="I still haven't received my card, when will it come?",
            created_by=reviewer,
        )
    )
    generation_b = item_b.generations.get()
    retrieved = list(generation_b.retrievals.select_related("example"))
    assert [r.example.output_text for r in retrieved] == [chosen.text]
    assert retrieved[0].score > 0.5

    assert [e.output_text for e in examples_sent(generation_b.messages)] == [chosen.text]
    sent = "\n".join(m["content"] for m in generation_b.messages)
    for candidate in rejected:
        assert candidate.text not in sent
    assert generation_b.messages[-1] == {"role": "user", "content": item_b.input_text}
    # The worker ranks a ready item's candidates after it is ready: let it finish, or its
    # writes meet the teardown's flush (a deadlock on PostgreSQL).
    wait_for(
        lambda: (
            not Generation.objects.filter(
                item__in=[item_a, item_b], ranked_at__isnull=True
            ).exists()
        ),
        what="the rankings",
    )


def test_rejected_answers_are_never_retrieved_as_preferred(worker_process: WorkerProcess) -> None:
    queue = QueueFactory(n_candidates=2)
    reviewer = UserFactory()
    item_a = _ready(
        item_create(queue=queue, input_text="My new card has not arrived yet.", created_by=reviewer)
    )
    decision = decision_record(
        item_id=item_a.pk,
        reviewer=reviewer,
        verdict=Decision.Verdict.NONE_ACCEPTABLE,
    )
    wait_for(
        lambda: not decision.examples.exclude(index_state=Example.IndexState.INDEXED).exists(),
        what="indexing",
    )
    item_b = _ready(
        item_create(queue=queue, input_text="My new card has not arrived yet!", created_by=reviewer)
    )
    # Only rejected answers exist: none of them may be offered as preferred.
    assert not item_b.generations.get().retrievals.exists()
    # The worker ranks a ready item's candidates after it is ready: let it finish, or its
    # writes meet the teardown's flush (a deadlock on PostgreSQL).
    wait_for(
        lambda: not item_b.generations.filter(ranked_at__isnull=True).exists(),
        what="the ranking",
    )


def test_candidates_arrive_in_the_browser_flow(
    worker_process: WorkerProcess, client: Client
) -> None:
    user = UserFactory()
    queue = QueueFactory(n_candidates=3, members=[user])
    client.force_login(user)

    response = client.post(
        f"/q/{queue.slug}/", {"input_text": "How do I activate my card?", "n_candidates": "2"}
    )
    item = Item.objects.get(queue=queue)
    assert response.status_code == 302 and response["Location"] == f"/items/{item.pk}/"

    def poll() -> Any:
        partial = client.get(f"/items/{item.pk}/", HTTP_HX_REQUEST="true")
        return partial if partial.status_code == 286 else None

    final = wait_for(poll, what="the candidates partial to stop polling")
    assert final.content.decode().count("Pick candidate") == 2
    generation = Generation.objects.get(item=item)
    assert generation.n_candidates == 2 and generation.status == Generation.Status.DONE

    candidate = generation.candidates.first()
    assert candidate is not None
    client.post(f"/items/{item.pk}/decide/", {"choice": f"c{candidate.pk}"})
    page = client.get(f"/items/{item.pk}/").content.decode()
    assert f"<strong>Chosen</strong> (candidate {candidate.label}) by {user.username}" in page
    assert Example.objects.filter(decision__item=item, role="preferred").count() == 1
