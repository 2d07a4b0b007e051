"""Which decisions count: standing ones, and each item's first among them (the one a
calibration, the dashboard and an item's sender read)."""

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from icrlhf.review.models import Decision
from tests.factories import DecisionFactory, GenerationFactory, ItemFactory

pytestmark = pytest.mark.django_db


def _decided(item: Any, *, at: Any, undone: bool = False) -> Decision:
    decision = DecisionFactory(generation=GenerationFactory(item=item))
    # created_at is set on insert: put it where the test needs it.
    Decision.objects.filter(pk=decision.pk).update(
        created_at=at, superseded_at=timezone.now() if undone else None
    )
    return decision


def test_each_item_counts_by_its_first_standing_decision_the_lower_id_first_on_a_tie(
    queue: Any,
) -> None:
    now = timezone.now()
    tied, other = ItemFactory(queue=queue), ItemFactory(queue=queue)
    _decided(tied, at=now - timedelta(minutes=5), undone=True)
    first_of_two = _decided(tied, at=now)
    _decided(tied, at=now)  # the same instant, a higher id
    only = _decided(other, at=now - timedelta(minutes=1))

    firsts = Decision.objects.filter(item__queue=queue).first_standing_per_item()

    assert list(firsts) == [only, first_of_two]  # oldest first
    assert tied.decisions.first_standing_per_item().get() == first_of_two


def test_the_first_is_taken_among_the_decisions_asked_for(queue: Any) -> None:
    now = timezone.now()
    item = ItemFactory(queue=queue)
    _decided(item, at=now - timedelta(days=2))
    later = _decided(item, at=now)

    recent = Decision.objects.filter(created_at__gte=now - timedelta(days=1))

    assert list(recent.first_standing_per_item()) == [later]
