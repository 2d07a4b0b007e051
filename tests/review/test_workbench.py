import threading
from datetime import timedelta
from typing import Any

import pytest
from django.conf import LazySettings
from django.core.exceptions import ValidationError
from django.db import connection
from django.test import Client
from django.utils import timezone

from icrlhf.generation import services as generation_services
from icrlhf.generation.models import Candidate, Generation
from icrlhf.memory.models import CurationEvent, Example
from icrlhf.queues.models import Item
from icrlhf.review import claims as review_claims
from icrlhf.review import decisions as review_decisions
from icrlhf.review.models import Claim, Decision
from tests.factories import (
    ItemFactory,
    QueueFactory,
    UserFactory,
    member_add,
    ready_generation,
    ready_item,
)

pytestmark = pytest.mark.django_db


def pick(item: Item, reviewer: Any, index: int = 0) -> Decision:
    candidate = item.generations.get().candidates.order_by("position")[index]
    return review_decisions.decision_record(
        item_id=item.pk, reviewer=reviewer, verdict="chosen", candidate_id=candidate.pk
    )


def test_a_decision_is_refused_while_another_reviewer_holds_the_item(queue: Any, user: Any) -> None:
    item = ready_item(queue)
    review_claims.claim_next(queue=queue, reviewer=UserFactory())
    with pytest.raises(review_claims.DecisionConflict, match="Another reviewer"):
        pick(item, user)
    assert not Decision.objects.exists()


def test_with_two_reviewers_per_item_each_decides_and_agreement_is_recorded(
    queue: Any, user: Any
) -> None:
    queue.reviewers_per_item = 2
    queue.save()
    other, third = UserFactory(), UserFactory()
    item = ready_item(queue)
    assert review_claims.claim_next(queue=queue, reviewer=user) == item
    assert review_claims.claim_next(queue=queue, reviewer=other) == item
    assert review_claims.claim_next(queue=queue, reviewer=third) is None  # both seats taken
    pick(item, user, 0)
    item.refresh_from_db()
    assert item.status == Item.Status.READY and item.agreement is None
    pick(item, other, 1)
    item.refresh_from_db()
    assert item.status == Item.Status.DECIDED
    assert item.agreement == 0.0
    with pytest.raises(review_claims.DecisionConflict, match="already"):
        pick(item, user, 0)


def test_agreement_is_the_share_of_agreeing_pairs() -> None:
    decisions = [Decision(chosen_candidate_id=c) for c in (1, 1, 2)]
    assert review_decisions.agreement_of(decisions) == pytest.approx(1 / 3)


def test_undo_supersedes_the_decision_and_withdraws_its_examples(
    queue: Any, user: Any, django_capture_on_commit_callbacks: Any
) -> None:
    item = ready_item(queue)
    decision = pick(item, user)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        review_decisions.decision_undo(decision_id=decision.pk, reviewer=user)
    decision.refresh_from_db()
    item.refresh_from_db()
    assert decision.superseded_at is not None
    assert item.status == Item.Status.READY
    withdrawn = Example.objects.filter(decision=decision)
    assert {(e.status, e.retired_reason) for e in withdrawn} == {
        ("retired", f"Withdrawn: decision {decision.pk} was undone.")
    }
    events = CurationEvent.objects.filter(action="retire", actor=user)
    assert sorted(e.example_id for e in events) == sorted(e.pk for e in withdrawn)
    assert len(callbacks) == 1  # the points are marked retired in the vector store
    assert Claim.objects.get(item=item, reviewer=user).expires_at > timezone.now()
    redo = pick(item, user, 2)  # decide again: a new standing decision
    assert Decision.objects.filter(superseded_at__isnull=True).get() == redo


def test_undo_is_refused_after_the_window(queue: Any, user: Any, settings: LazySettings) -> None:
    decision = pick(ready_item(queue), user)
    Decision.objects.filter(pk=decision.pk).update(
        created_at=timezone.now() - timedelta(seconds=settings.REVIEW_UNDO_WINDOW_S + 1)
    )
    with pytest.raises(review_claims.DecisionConflict, match="undo window has passed"):
        review_decisions.decision_undo(decision_id=decision.pk, reviewer=user)
    with pytest.raises(review_claims.DecisionConflict, match="no decision of yours"):
        review_decisions.decision_undo(decision_id=decision.pk, reviewer=UserFactory())


def test_reason_tags_must_be_the_queues(queue: Any, user: Any) -> None:
    queue.reason_tags = ["too long", "wrong facts"]
    queue.save()
    item = ready_item(queue)
    candidate = item.generations.get().candidates.first()
    with pytest.raises(ValidationError, match="Unknown reason: rude"):
        review_decisions.decision_record(
            item_id=item.pk, reviewer=user, verdict="none_acceptable", reason_tags=["rude"]
        )
    decision = review_decisions.decision_record(
        item_id=item.pk,
        reviewer=user,
        verdict="chosen",
        candidate_id=candidate.pk,
        reason_tags=["too long", "too long"],
        comment="  shorter please ",
    )
    assert (decision.reason_tags, decision.comment) == (["too long"], "shorter please")


def test_a_failed_candidate_can_be_retried(
    queue: Any, django_capture_on_commit_callbacks: Any
) -> None:
    ready_item(queue, ("fine", "broken"))
    broken = Candidate.objects.get(text="broken")
    Candidate.objects.filter(pk=broken.pk).update(status="failed", error="rate limit")
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        generation_services.candidate_retry(candidate_id=broken.pk)
    broken.refresh_from_db()
    assert (broken.status, broken.error, len(callbacks)) == ("pending", "", 1)
    assert broken.generation.status == Generation.Status.RUNNING
    with pytest.raises(ValidationError, match="Only a failed candidate"):
        generation_services.candidate_retry(candidate_id=broken.pk)


def test_an_undecided_item_can_be_regenerated(
    queue: Any, user: Any, django_capture_on_commit_callbacks: Any
) -> None:
    item = ready_item(queue)
    with django_capture_on_commit_callbacks(execute=False):
        fresh = generation_services.generation_regenerate(item_id=item.pk)
    item.refresh_from_db()
    assert item.status == Item.Status.GENERATING
    assert item.generations.count() == 2 and fresh.candidates.count() == 3
    decided = ready_item(queue)
    pick(decided, user)
    with pytest.raises(ValidationError, match="cannot be regenerated"):
        generation_services.generation_regenerate(item_id=decided.pk)


@pytest.mark.parametrize("url", ["/q/{slug}/", "/q/{slug}/review/", "/items/{item}/"])
def test_a_non_member_cannot_see_a_queue_or_its_items(url: str, user: Any) -> None:
    queue = QueueFactory()  # user is not a member
    item = ready_item(queue)
    client = Client()
    client.force_login(user)
    assert client.get(url.format(slug=queue.slug, item=item.pk)).status_code == 404
    assert queue.name not in client.get("/").content.decode()


def test_a_member_without_a_reviewer_role_can_read_but_not_decide(queue: Any) -> None:
    reader = UserFactory()
    member_add(queue, reader, "viewer")
    item = ready_item(queue)
    client = Client()
    client.force_login(reader)
    page = client.get(f"/items/{item.pk}/").content.decode()
    assert "Pick candidate" not in page
    candidate = item.generations.get().candidates.first()
    response = client.post(f"/items/{item.pk}/decide/", {"choice": f"c{candidate.pk}"})
    assert response.status_code == 403
    assert not Decision.objects.exists()


def test_reviewers_cannot_reach_the_admin(logged_in: Client) -> None:
    response = logged_in.get("/admin/")
    assert response.status_code == 302 and "/admin/login/" in response["Location"]


def test_the_next_item_and_decide_flow_moves_on_and_offers_undo(
    logged_in: Client, queue: Any
) -> None:
    first, second = ready_item(queue), ready_item(queue)
    response = logged_in.post(f"/q/{queue.slug}/review/next/")
    assert response["Location"] == f"/items/{first.pk}/"
    page = logged_in.get(response["Location"]).content.decode()
    assert "This item is yours until" in page and "Pick candidate 1" in page
    candidate = first.generations.get().candidates.first()
    response = logged_in.post(f"/items/{first.pk}/decide/", {"choice": f"c{candidate.pk}"})
    assert response["Location"] == f"/items/{second.pk}/"
    page = logged_in.get(response["Location"]).content.decode()
    assert f"Saved item {first.pk}: chosen." in page and "data-undo-until" in page
    decision = Decision.objects.get()
    undone = logged_in.post(f"/decisions/{decision.pk}/undo/", follow=True)
    assert f"Undone: item {first.pk} is yours to decide again." in undone.content.decode()


@pytest.mark.slow  # fifty threads at once: seconds on two cores
@pytest.mark.django_db(transaction=True)
def test_fifty_concurrent_submits_record_exactly_one_decision() -> None:
    reviewers = [UserFactory() for _ in range(50)]
    queue = QueueFactory(members=reviewers)
    item = ready_item(queue, ("a", "b", "c", "d"))
    candidates = list(item.generations.get().candidates.all())
    barrier = threading.Barrier(len(reviewers))
    outcomes: list[str] = []

    def submit(index: int) -> None:
        client = Client()
        client.force_login(reviewers[index])
        choice = f"c{candidates[index % len(candidates)].pk}"
        barrier.wait()
        response = client.post(f"/items/{item.pk}/decide/", {"choice": choice}, follow=True)
        body = response.content.decode()
        outcomes.append(
            "saved"
            if f"Saved item {item.pk}" in body
            else "refused"
            if ("already been decided" in body or "Another reviewer" in body)
            else f"other {response.status_code}"
        )
        connection.close()

    threads = [threading.Thread(target=submit, args=(i,)) for i in range(len(reviewers))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(set(outcomes)) == ["refused", "saved"]
    assert outcomes.count("saved") == 1 and outcomes.count("refused") == 49
    assert Decision.objects.count() == 1
    decision = Decision.objects.get()
    assert Example.objects.filter(role="preferred").count() == 1
    assert Example.objects.filter(decision=decision).count() == 4


def test_an_open_page_renews_its_claim_and_says_when_it_was_lost(
    logged_in: Client, queue: Any, user: Any
) -> None:
    item = ready_item(queue)
    logged_in.get(f"/items/{item.pk}/")  # opening it claims it
    Claim.objects.update(expires_at=timezone.now() + timedelta(seconds=5))
    renewed = logged_in.post(f"/items/{item.pk}/claim/", HTTP_HX_REQUEST="true")
    assert "This item is yours until" in renewed.content.decode()
    assert Claim.objects.get().expires_at > timezone.now() + timedelta(minutes=9)

    Claim.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    review_claims.claim_next(queue=queue, reviewer=UserFactory())  # someone else takes it
    lost = logged_in.post(f"/items/{item.pk}/claim/", HTTP_HX_REQUEST="true")
    assert "Your hold on this item has lapsed" in lost.content.decode()


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [("comment", "x" * 5001, "Comment: "), ("shown_at_ms", "-5", "Time shown: ")],
)
def test_a_refused_decision_says_the_real_reason(
    logged_in: Client, queue: Any, field: str, value: str, reason: str
) -> None:
    from icrlhf.review.models import Decision

    item = ItemFactory(queue=queue)
    candidate = ready_generation(item, texts=["one", "two"]).candidates.first()
    logged_in.get(f"/items/{item.pk}/")  # claims it
    response = logged_in.post(
        f"/items/{item.pk}/decide/", {"choice": f"c{candidate.pk}", field: value}, follow=True
    )
    page = response.content.decode()
    assert reason in page and "Nothing was saved." in page
    assert "Choose a candidate" not in page
    assert not Decision.objects.exists()
