import hashlib
import hmac
import json
from datetime import timedelta
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.test import Client
from django.utils import timezone

from icrlhf.generation.models import Candidate
from icrlhf.integrations.webhooks import WebhookTransientError
from icrlhf.kinds.triage.sla import sla_ordered, sla_state
from icrlhf.memory.models import Example
from icrlhf.queues.models import Item
from icrlhf.review import claims as review_claims
from icrlhf.review import decisions as review_decisions
from icrlhf.review import tasks as review_tasks
from icrlhf.review import webhooks as review_webhooks
from tests.factories import ItemFactory, ready_generation
from tests.support.webhook_receiver import Receiver

pytestmark = pytest.mark.django_db

GOOD = {"category": "card_arrival", "priority": "high", "reply": "It ships today."}


def triage_item(queue: Any, *candidates: dict[str, str] | None) -> Item:
    item = ItemFactory(queue=queue, subject="Card?", body="Where is my card?")
    generation = ready_generation(item, [json.dumps(c) if c else "gibberish" for c in candidates])
    for candidate, fields in zip(
        generation.candidates.order_by("position"), candidates, strict=True
    ):
        Candidate.objects.filter(pk=candidate.pk).update(
            fields=fields, parse_error="" if fields else "The answer names no category."
        )
    return item


def decide(item: Item, user: Any, index: int, **corrections: str) -> Any:
    candidate = item.generations.get().candidates.order_by("position")[index]
    return review_decisions.decision_record(
        item_id=item.pk,
        reviewer=user,
        verdict="chosen",
        candidate_id=candidate.pk,
        corrections=corrections,
    )


def test_picking_a_triage_confirms_it_and_writes_it_back(triage_queue: Any, user: Any) -> None:
    item = triage_item(triage_queue, GOOD, {**GOOD, "category": "exchange_rate"})
    decision = decide(item, user, 0)
    assert decision.verdict == "chosen" and decision.final_fields == GOOD
    item.refresh_from_db()
    assert (item.category, item.priority, item.ticket_status) == ("card_arrival", "high", "open")
    assert item.triaged_at is not None
    preferred = Example.objects.get(role="preferred")
    assert json.loads(preferred.output_text) == GOOD
    assert preferred.input_text == item.input_text


def test_a_corrected_field_makes_an_edit(triage_queue: Any, user: Any) -> None:
    item = triage_item(triage_queue, GOOD)
    decision = decide(item, user, 0, category="lost_or_stolen_card", priority="")
    assert decision.verdict == "edited"
    assert decision.final_fields == {**GOOD, "category": "lost_or_stolen_card"}
    assert Item.objects.get(pk=item.pk).category == "lost_or_stolen_card"
    rejected = Example.objects.get(role="rejected")
    assert json.loads(rejected.output_text) == GOOD  # the model's triage, as it proposed it


def test_an_invalid_candidate_can_be_the_base_of_a_full_correction(
    triage_queue: Any, user: Any
) -> None:
    item = triage_item(triage_queue, None)
    with pytest.raises(ValidationError, match="The triage is incomplete: No category"):
        decide(item, user, 0)
    decision = decide(item, user, 0, category="exchange_rate", priority="low", reply="See app.")
    assert decision.verdict == "edited"
    assert decision.final_fields == {
        "category": "exchange_rate",
        "priority": "low",
        "reply": "See app.",
    }
    assert Example.objects.get(role="rejected").output_text == "gibberish"


def test_tickets_are_worked_most_urgent_first(triage_queue: Any) -> None:
    now = timezone.now()
    late_normal = ItemFactory(
        queue=triage_queue, priority="normal", sla_due_at=now - timedelta(hours=1)
    )
    urgent = ItemFactory(queue=triage_queue, priority="urgent", sla_due_at=now + timedelta(hours=2))
    soon_normal = ItemFactory(
        queue=triage_queue, priority="normal", sla_due_at=now + timedelta(minutes=30)
    )
    low = ItemFactory(queue=triage_queue, priority="low", sla_due_at=now + timedelta(days=2))
    ordered = list(sla_ordered(Item.objects.filter(queue=triage_queue)))
    assert ordered == [urgent, late_normal, soon_normal, low]
    assert [sla_state(i, now) for i in ordered] == ["", "breached", "due soon", ""]


def test_next_item_in_a_triage_queue_takes_the_most_urgent(triage_queue: Any, user: Any) -> None:
    normal = triage_item(triage_queue, GOOD)
    urgent = triage_item(triage_queue, GOOD)
    Item.objects.filter(pk=urgent.pk).update(priority="urgent")
    assert review_claims.claim_next(queue=triage_queue, reviewer=user) == urgent
    assert normal != urgent


def test_the_ticket_list_filters_and_shows_sla_badges(triage_queue: Any, logged_in: Client) -> None:
    ItemFactory(
        queue=triage_queue,
        subject="Breached one",
        priority="high",
        sla_due_at=timezone.now() - timedelta(minutes=5),
        channel="email",
    )
    ItemFactory(
        queue=triage_queue,
        subject="Chat one",
        channel="chat",
        category="exchange_rate",
        sla_due_at=timezone.now() + timedelta(hours=5),
    )
    page = logged_in.get(f"/q/{triage_queue.slug}/").content.decode()
    assert "Breached one" in page and "Chat one" in page
    assert 'class="badge sla-breached">breached' in page
    filtered = logged_in.get(f"/q/{triage_queue.slug}/?channel=chat&category=exchange_rate")
    assert "Chat one" in filtered.content.decode()
    assert "Breached one" not in filtered.content.decode()


def test_a_triaged_ticket_is_posted_signed_and_retried_on_a_5xx(
    triage_queue: Any, user: Any, django_capture_on_commit_callbacks: Any
) -> None:
    receiver = Receiver([503])
    triage_queue.webhook_url, triage_queue.webhook_secret = receiver.url, "s3cret"
    triage_queue.save()
    item = triage_item(triage_queue, GOOD)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        decision = decide(item, user, 0)
    assert len(callbacks) == 2  # index the examples, send the webhook

    with pytest.raises(WebhookTransientError, match="answered 503"):
        review_webhooks.decision_webhook_send(decision_id=decision.pk, event="ticket.triaged")
    result = review_tasks.decision_webhook.apply(args=[decision.pk])  # eager: retries inline
    assert result.successful()
    headers, body = receiver.requests[-1]
    signed = headers["X-Icrlhf-Timestamp"].encode() + b"." + body
    expected = "sha256=" + hmac.new(b"s3cret", signed, hashlib.sha256).hexdigest()
    assert headers["X-Icrlhf-Signature"] == expected
    assert headers["X-Icrlhf-Event"] == "ticket.triaged"
    payload = json.loads(body)
    assert payload["triage"] == GOOD
    assert payload["ticket"] == {
        "id": item.pk,
        "external_id": "",
        "subject": "Card?",
        "status": "open",
        "category": "card_arrival",
        "priority": "high",
    }
    receiver.server.shutdown()


def test_a_ticket_typed_in_by_hand_gets_its_sla_and_triage(
    triage_queue: Any, logged_in: Client, django_capture_on_commit_callbacks: Any
) -> None:
    with django_capture_on_commit_callbacks(execute=False):
        response = logged_in.post(
            f"/q/{triage_queue.slug}/",
            {
                "subject": "Lost card",
                "body": "I lost my card",
                "priority": "urgent",
                "channel": "phone",
            },
        )
    item = Item.objects.get()
    assert response["Location"] == f"/items/{item.pk}/"
    assert (item.subject, item.body, item.priority, item.source) == (
        "Lost card",
        "I lost my card",
        "urgent",
        "ui",
    )
    assert item.sla_due_at is not None
    bad = logged_in.post(f"/q/{triage_queue.slug}/", {"subject": "", "body": ""})
    assert bad.status_code == 400 and "This field is required." in bad.content.decode()


def test_undoing_a_triage_gives_the_ticket_back_what_it_had_and_tells_the_helpdesk(
    triage_queue: Any,
    user: Any,
    django_capture_on_commit_callbacks: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The webhook task runs inline here (the worker's own run is in the integration tests).
    webhook = review_tasks.decision_webhook
    monkeypatch.setattr(webhook, "delay", lambda *args: webhook.apply(args=args))
    receiver = Receiver([])
    triage_queue.webhook_url, triage_queue.webhook_secret = receiver.url, "s3cret"
    triage_queue.save()
    item = triage_item(triage_queue, GOOD)
    Item.objects.filter(pk=item.pk).update(priority="low", category="")
    untouched = ItemFactory(queue=triage_queue, priority="normal")
    before = Item.objects.values("category", "priority", "ticket_status", "triaged_at")
    original = before.get(pk=item.pk)
    order_before = list(sla_ordered(Item.objects.filter(queue=triage_queue)))

    with django_capture_on_commit_callbacks(execute=True):
        decision = decide(item, user, 0)
    assert before.get(pk=item.pk)["priority"] == "high"
    with django_capture_on_commit_callbacks(execute=True):
        review_decisions.decision_undo(decision_id=decision.pk, reviewer=user)

    assert before.get(pk=item.pk) == original
    assert list(sla_ordered(Item.objects.filter(queue=triage_queue))) == order_before
    assert order_before == [untouched, item]  # normal before low, as before the triage
    events = [json.loads(body) for _, body in receiver.requests]
    assert [e["event"] for e in events] == ["ticket.triaged", "ticket.triage_undone"]
    undone = events[1]
    assert undone["ticket"]["status"] == original["ticket_status"]
    assert (undone["ticket"]["category"], undone["ticket"]["priority"]) == ("", "low")
    assert undone["triage"] == GOOD and undone["undone_at"] is not None
    receiver.server.shutdown()


def test_the_ticket_list_shows_what_waits_for_review_unless_asked_for_decided_ones(
    triage_queue: Any, logged_in: Client
) -> None:
    ItemFactory(queue=triage_queue, subject="Waiting one")
    ItemFactory(queue=triage_queue, subject="Decided one", status=Item.Status.DECIDED)
    default = logged_in.get(f"/q/{triage_queue.slug}/").content.decode()
    assert "Waiting one" in default and "Decided one" not in default
    decided = logged_in.get(f"/q/{triage_queue.slug}/?review=decided").content.decode()
    assert "Decided one" in decided and "Waiting one" not in decided
    every = logged_in.get(f"/q/{triage_queue.slug}/?review=all").content.decode()
    assert "Decided one" in every and "Waiting one" in every
