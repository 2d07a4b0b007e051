"""Automation: a confident first candidate applied without review (a triage written back,
the webhook sent), sampled audits, undo, and who may undo."""

import json
from typing import Any

import pytest
from django.test import Client

from icrlhf.generation.models import Calibration, Candidate
from icrlhf.generation.ranking import FEATURES
from icrlhf.queues.models import Item
from icrlhf.review import automation, claims, decisions, guard
from icrlhf.review.models import Automation
from tests.factories import QueueFactory, UserFactory, ready_generation
from tests.support.webhook_receiver import Receiver
from tests.triage.test_triage import GOOD, decide, triage_item

pytestmark = pytest.mark.django_db

OTHER = {**GOOD, "category": "exchange_rate"}


def ranked(item: Item, *confidences: float) -> int:
    """The item's generation as the ranking leaves it, with these confidences in order."""
    generation = item.generations.get()
    calibration = Calibration.objects.create(
        queue=item.queue,
        features=list(FEATURES),
        coefficients=[0.0] * (len(FEATURES) + 1),
        top_coefficients=[0.0, 1.0],
        items=40,
        candidates=80,
        accepted_share=0.7,
    )
    generation.calibration = calibration
    generation.save()
    for candidate, confidence in zip(
        generation.candidates.order_by("position"), confidences, strict=True
    ):
        Candidate.objects.filter(pk=candidate.pk).update(confidence=confidence)
    return generation.pk


@pytest.fixture
def automating(triage_queue: Any) -> Any:
    triage_queue.auto_apply_threshold, triage_queue.audit_percent = 0.9, 0
    triage_queue.save()
    return triage_queue


def test_a_confident_triage_is_written_back_and_sent_without_review(
    automating: Any, django_capture_on_commit_callbacks: Any, eager_tasks: None
) -> None:
    receiver = Receiver([])
    automating.webhook_url, automating.webhook_secret = receiver.url, "s3cret"
    automating.save()
    item = triage_item(automating, GOOD, OTHER)
    with django_capture_on_commit_callbacks(execute=True):
        applied = automation.generation_consider(generation_id=ranked(item, 0.95, 0.1))
    assert applied is not None and not applied.audit
    item.refresh_from_db()
    assert (item.status, item.category, item.priority) == ("automated", "card_arrival", "high")
    assert item.triaged_at is not None
    body = json.loads(receiver.requests[-1][1])
    assert body["event"] == "ticket.triaged"
    assert body["automated"] is True and body["confidence"] == 0.95
    assert body["decided_by"] is None and body["triage"] == GOOD
    assert body["ticket"]["category"] == "card_arrival"


def test_below_the_threshold_or_with_automation_off_it_stays_with_the_reviewers(
    automating: Any,
) -> None:
    item = triage_item(automating, GOOD)
    assert automation.generation_consider(generation_id=ranked(item, 0.89)) is None
    automating.auto_apply_threshold = None
    automating.save()
    other = triage_item(automating, GOOD)
    assert automation.generation_consider(generation_id=ranked(other, 0.99)) is None
    assert set(Item.objects.values_list("status", flat=True)) == {"ready"}
    assert not Automation.objects.exists()


def test_an_item_a_reviewer_holds_or_a_triage_missing_a_field_is_never_applied(
    automating: Any, user: Any
) -> None:
    held = triage_item(automating, GOOD)
    claims.claim_take(item_id=held.pk, reviewer=user)
    assert automation.generation_consider(generation_id=ranked(held, 0.99)) is None
    broken = triage_item(automating, None)
    assert automation.generation_consider(generation_id=ranked(broken, 0.99)) is None


def test_an_audited_item_is_applied_and_still_reviewed(automating: Any, user: Any) -> None:
    automating.audit_percent = 100
    automating.save()
    item = triage_item(automating, GOOD, OTHER)
    applied = automation.generation_consider(generation_id=ranked(item, 0.95, 0.1))
    assert applied is not None and applied.audit
    item.refresh_from_db()
    assert (item.status, item.category) == ("ready", "card_arrival")  # applied, in review
    with pytest.raises(claims.DecisionConflict, match="sampled for audit"):
        automation.automation_undo(automation_id=applied.pk, actor=user)  # its audit decides

    decision = decide(item, user, 1)  # the reviewer disagrees
    applied.refresh_from_db()
    assert applied.audit_decision == decision
    assert guard.audit_agreed(applied) is False
    item.refresh_from_db()
    assert (item.status, item.category) == ("decided", "exchange_rate")
    with pytest.raises(claims.DecisionConflict, match="undo their decision instead"):
        automation.automation_undo(automation_id=applied.pk, actor=user)

    decisions.decision_undo(decision_id=decision.pk, reviewer=user)  # the audit is open again
    applied.refresh_from_db()
    assert applied.audit_decision is None
    decide(item, user, 0)
    applied.refresh_from_db()
    assert guard.audit_agreed(applied) is True


def test_undo_puts_the_ticket_back_and_sends_the_item_to_review(
    automating: Any, user: Any, django_capture_on_commit_callbacks: Any, eager_tasks: None
) -> None:
    receiver = Receiver([])
    automating.webhook_url = receiver.url
    automating.save()
    item = triage_item(automating, GOOD)
    Item.objects.filter(pk=item.pk).update(category="", priority="low")
    with django_capture_on_commit_callbacks(execute=True):
        applied = automation.generation_consider(generation_id=ranked(item, 0.97))
    assert applied is not None
    with django_capture_on_commit_callbacks(execute=True):
        automation.automation_undo(automation_id=applied.pk, actor=user)
    item.refresh_from_db()
    assert (item.status, item.category, item.priority, item.triaged_at) == (
        "ready",
        "",
        "low",
        None,
    )
    assert [json.loads(body)["event"] for _, body in receiver.requests] == [
        "ticket.triaged",
        "ticket.triage_undone",
    ]
    with pytest.raises(claims.DecisionConflict, match="already been undone"):
        automation.automation_undo(automation_id=applied.pk, actor=user)
    # Back in review, for good: it is not applied again, nor regenerated before the undo.
    assert automation.generation_consider(generation_id=item.generations.get().pk) is None
    # A reviewer decides it as any other item.
    decide(item, user, 0)
    assert Item.objects.get(pk=item.pk).status == "decided"


def test_only_reviewers_of_the_queue_undo_and_the_page_says_what_happened(
    automating: Any, user: Any, logged_in: Client
) -> None:
    item = triage_item(automating, GOOD)
    applied = automation.generation_consider(generation_id=ranked(item, 0.97))
    assert applied is not None
    page = logged_in.get(f"/items/{item.pk}/").content.decode()
    assert "Applied automatically" in page and "97%" in page
    assert "Undo the automatic application" in page

    url = f"/automations/{applied.pk}/undo/"
    outsider = Client()
    outsider.force_login(UserFactory())
    assert outsider.post(url).status_code == 404
    viewer = Client()
    viewer.force_login(UserFactory())
    automating.members.add(viewer.session["_auth_user_id"], through_defaults={"role": "viewer"})
    assert viewer.post(url).status_code == 403
    elsewhere = Client()  # a reviewer of another queue
    elsewhere.force_login(UserFactory())
    QueueFactory(members=[elsewhere.session["_auth_user_id"]])
    assert elsewhere.post(url).status_code == 404
    assert Automation.objects.get(pk=applied.pk).undone_at is None
    regenerate = logged_in.post(f"/items/{item.pk}/regenerate/", follow=True).content.decode()
    assert "undo that first" in regenerate

    response = logged_in.post(url, follow=True)
    assert "is back in review" in response.content.decode()
    assert Automation.objects.get(pk=applied.pk).undone_by == user
    assert Item.objects.get(pk=item.pk).status == "ready"


def test_a_general_item_applied_without_review_reads_so_in_the_api(db: None) -> None:
    from icrlhf.ingest.services import token_create

    queue = QueueFactory(auto_apply_threshold=0.8, audit_percent=0)
    token = token_create(queue=queue, name="app")[1]
    item = Item.objects.create(queue=queue, input_text="Fee?", status=Item.Status.READY)
    ready_generation(item, ["One euro.", "Two euros."])
    applied = automation.generation_consider(generation_id=ranked(item, 0.93, 0.2))
    assert applied is not None

    read = Client().get(f"/api/v1/items/{item.pk}", HTTP_AUTHORIZATION=f"Bearer {token}").json()
    assert read["status"] == "automated" and read["decision"] is None
    assert read["final_text"] == "One euro."
    assert read["automation"]["confidence"] == 0.93 and read["automation"]["audit"] is False
    assert [c["confidence"] for c in read["candidates"]] == [0.93, 0.2]


def test_the_dashboard_shows_what_was_automated_and_how_right_the_audits_found_it(
    automating: Any, user: Any, logged_in: Client
) -> None:
    from icrlhf.insights.selectors import queue_dashboard

    automating.audit_percent = 100
    automating.save()
    for keep in (0, 1):  # the first audit keeps what was applied, the second changes it
        item = triage_item(automating, GOOD, OTHER)
        assert automation.generation_consider(generation_id=ranked(item, 0.95, 0.1))
        decide(item, user, keep)
    automating.audit_percent = 0
    automating.save()
    undone = triage_item(automating, GOOD)
    applied = automation.generation_consider(generation_id=ranked(undone, 0.99))
    assert applied is not None
    automation.automation_undo(automation_id=applied.pk, actor=user)

    board = queue_dashboard(queue=automating).automation
    assert (board.automated, board.undone) == (2, 1)
    assert (board.audit.reviewed, board.audit.accepted) == (2, 1)
    today = board.by_day[-1]
    assert (today.automated, today.audit.rate) == (2, 0.5)
    page = logged_in.get(f"/q/{automating.slug}/dashboard/").content.decode()
    assert "50%</strong><span>audited precision (2 audited" in page


def test_a_ticket_triaged_automatically_leaves_the_waiting_list(
    automating: Any, logged_in: Client
) -> None:
    item = triage_item(automating, GOOD)
    Item.objects.filter(pk=item.pk).update(subject="Auto-triaged ticket")
    assert automation.generation_consider(generation_id=ranked(item, 0.97))
    waiting = logged_in.get(f"/q/{automating.slug}/").content.decode()
    assert "Auto-triaged ticket" not in waiting
    applied = logged_in.get(f"/q/{automating.slug}/?review=automated").content.decode()
    assert "Auto-triaged ticket" in applied
