"""Who works on which item (review/claims.py): one reviewer per slot, the next item, expiry
and skipping, and regenerating or retrying only by the reviewer who holds the item."""

from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from icrlhf.generation.models import Candidate, Generation
from icrlhf.review import claims as review_claims
from icrlhf.review.models import Claim
from tests.factories import UserFactory, ready_item

pytestmark = pytest.mark.django_db


def test_two_reviewers_never_hold_the_same_item(queue: Any, user: Any) -> None:
    other = UserFactory()
    queue.members.add(other)
    first, second = ready_item(queue), ready_item(queue)
    assert review_claims.claim_next(queue=queue, reviewer=user) == first
    assert review_claims.claim_next(queue=queue, reviewer=other) == second
    assert review_claims.claim_next(queue=queue, reviewer=UserFactory()) is None
    assert review_claims.claim_next(queue=queue, reviewer=user) == first  # its own claim back


def test_more_reviewers_than_the_next_item_window_all_get_an_item(
    queue: Any, user: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(review_claims, "_NEXT_ITEM_WINDOW", 2)
    items = [ready_item(queue) for _ in range(4)]
    others = [UserFactory(), UserFactory()]
    held = [review_claims.claim_next(queue=queue, reviewer=other) for other in others]
    assert held == items[:2]  # the whole window is taken by others' claims
    assert review_claims.claim_next(queue=queue, reviewer=user) == items[2]


def test_an_expired_claim_frees_the_item(queue: Any, user: Any) -> None:
    item = ready_item(queue)
    review_claims.claim_next(queue=queue, reviewer=user)
    Claim.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    assert review_claims.claim_next(queue=queue, reviewer=UserFactory()) == item


def test_a_skipped_item_goes_to_others_first_and_comes_back_after_the_rest(
    queue: Any, user: Any
) -> None:
    first, second = ready_item(queue), ready_item(queue)
    assert review_claims.claim_next(queue=queue, reviewer=user) == first
    review_claims.claim_release(item_id=first.pk, reviewer=user, skipped=True)
    assert review_claims.claim_next(queue=queue, reviewer=UserFactory()) == first
    assert review_claims.claim_next(queue=queue, reviewer=user) == second
    review_claims.claim_release(item_id=second.pk, reviewer=user, skipped=True)
    Claim.objects.update(expires_at=timezone.now())  # the other reviewer let go too
    assert review_claims.claim_next(queue=queue, reviewer=user) == first  # usual order


def test_regenerate_and_retry_follow_the_claim(
    queue: Any, user: Any, django_capture_on_commit_callbacks: Any
) -> None:
    """Another reviewer cannot replace or retry the candidates of an item someone holds:
    the holder's choice would then be refused. The holder can, and so can anyone once the
    claim has run out."""
    item = ready_item(queue, ("fine", "broken"))
    broken = Candidate.objects.get(text="broken")
    Candidate.objects.filter(pk=broken.pk).update(status="failed", error="rate limit")
    holder = UserFactory(username="holder")
    queue.members.add(holder)
    assert review_claims.claim_take(item_id=item.pk, reviewer=holder) is not None
    other = Client()
    other.force_login(user)

    page = other.get(f"/items/{item.pk}/").content.decode()
    assert "Regenerate" not in page and "Retry candidate" not in page
    refused = other.post(f"/items/{item.pk}/regenerate/", follow=True).content.decode()
    assert "holder is working on this item, so it cannot be regenerated now." in refused
    refused = other.post(f"/candidates/{broken.pk}/retry/", follow=True).content.decode()
    assert "holder is working on this item, so it cannot be retried now." in refused
    broken.refresh_from_db()
    assert (item.generations.count(), broken.status) == (1, "failed")

    with django_capture_on_commit_callbacks(execute=False):
        review_claims.candidate_retry(candidate_id=broken.pk, reviewer=holder)
        Candidate.objects.filter(pk=broken.pk).update(status="done", text="mended")
        Generation.objects.update(status=Generation.Status.DONE)
        Claim.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
        review_claims.item_regenerate(item_id=item.pk, reviewer=user)
    assert item.generations.count() == 2
