"""The slot rule: how many more reviewers an item can take, one rule for the page, a claim,
a decision and "next item"."""

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from icrlhf.review import claims
from icrlhf.review.models import Claim
from icrlhf.review.selectors import free_slots
from tests.factories import DecisionFactory, ItemFactory, UserFactory, ready_generation

pytestmark = pytest.mark.django_db


def test_standing_decisions_and_others_live_claims_take_the_slots(queue: Any, user: Any) -> None:
    queue.reviewers_per_item = 3
    queue.save()
    item = ItemFactory(queue=queue)
    generation = ready_generation(item, ["one", "two"])
    now = timezone.now()
    DecisionFactory(generation=generation)  # takes a slot
    DecisionFactory(generation=generation, superseded_at=now)  # undone: takes none
    Claim.objects.create(item=item, reviewer=UserFactory(), expires_at=now + timedelta(minutes=5))
    Claim.objects.create(item=item, reviewer=UserFactory(), expires_at=now - timedelta(minutes=5))
    Claim.objects.create(item=item, reviewer=user, expires_at=now + timedelta(minutes=5))

    assert free_slots(item=item, reviewer=user, now=now) == 1  # their own claim is theirs
    assert free_slots(item=item, reviewer=UserFactory(), now=now) == 0
    assert claims.claim_next(queue=queue, reviewer=UserFactory()) is None
    queue.reviewers_per_item = 4
    queue.save()
    assert claims.claim_next(queue=queue, reviewer=UserFactory()) == item
