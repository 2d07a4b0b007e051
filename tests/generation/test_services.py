"""Creating an item and starting its generations (generation/services.py): the item and its
N pending candidates, preparation sent once the transaction commits, the sender's external
id kept once, end users' words redacted on the way in, and a decided item's candidates
still coming stopped. The worker's side is in test_pipeline.py."""

from typing import Any

import pytest

from icrlhf.generation import services
from icrlhf.generation.models import Candidate, Generation
from icrlhf.queues.models import Item
from tests.factories import DecisionFactory, QueueFactory

pytestmark = pytest.mark.django_db


def test_an_item_starts_with_n_pending_candidates_prepared_after_commit(
    django_capture_on_commit_callbacks: Any,
) -> None:
    queue = QueueFactory(n_candidates=3)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        item = services.item_create(
            queue=queue, input_text="  Where is my card?  ", created_by=None
        )
    generation = item.generations.get()
    assert item.status == Item.Status.GENERATING and item.input_text == "Where is my card?"
    assert generation.status == Generation.Status.PENDING
    assert [c.status for c in generation.candidates.order_by("position")] == ["pending"] * 3
    assert len(callbacks) == 1  # the preparation, sent only once the item exists for the worker


def test_an_external_id_makes_one_item_however_often_it_is_sent(
    django_capture_on_commit_callbacks: Any,
) -> None:
    queue = QueueFactory()
    with django_capture_on_commit_callbacks(execute=False):
        first, created = services.item_create_once(
            queue=queue, external_id="T-1", input_text="Hi", created_by=None
        )
        again, created_again = services.item_create_once(
            queue=queue, external_id="T-1", input_text="Hi again", created_by=None
        )
    assert (created, created_again, again) == (True, False, first)
    assert Item.objects.filter(queue=queue).count() == 1


def test_end_users_words_are_redacted_as_the_item_is_made(
    django_capture_on_commit_callbacks: Any, settings: Any
) -> None:
    settings.REDACTION = "all"
    with django_capture_on_commit_callbacks(execute=False):
        item = services.item_create(
            queue=QueueFactory(),
            input_text="Mail me at jane.doe@example.com",
            created_by=None,
            subject="From jane.doe@example.com",
            external_id="jane.doe@example.com",  # the sender's own field: kept as sent
        )
    assert "jane.doe@example.com" not in item.input_text + item.subject
    assert item.external_id == "jane.doe@example.com"


def test_a_decided_items_candidates_still_coming_are_stopped(
    django_capture_on_commit_callbacks: Any,
) -> None:
    with django_capture_on_commit_callbacks(execute=False):
        item = services.item_create(queue=QueueFactory(), input_text="Hi", created_by=None)
    generation = item.generations.get()
    generation.candidates.filter(position=0).update(status=Candidate.Status.DONE, text="Hello")
    # Still open to a reviewer (no decision yet): it goes on generating.
    assert services.generations_stop_if_decided(item_id=item.pk) == 0
    DecisionFactory(item=item, generation=generation)
    Item.objects.filter(pk=item.pk).update(status=Item.Status.DECIDED)  # as settling does
    stopped = services.generations_stop_if_decided(item_id=item.pk)
    assert stopped == generation.candidates.exclude(status=Candidate.Status.DONE).count() > 0
    assert not generation.candidates.filter(status=Candidate.Status.PENDING).exists()
