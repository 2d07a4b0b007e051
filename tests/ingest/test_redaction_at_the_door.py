"""What end users wrote in a ticket or an item an application sends passes the one redaction
before it is stored: review, memory and exports never see it (REDACTION "captured" or "all");
"off" keeps it as sent. The sender's own fields (external_id, metadata) come back as sent."""

from typing import Any

import pytest
from django.test import Client

from icrlhf.ingest.services import token_create
from icrlhf.queues.models import Item
from tests.factories import QueueFactory

pytestmark = pytest.mark.django_db

EMAIL, CARD = "ana.lima@example.com", "4111 1111 1111 1111"


def post(path: str, body: object, token: str) -> Any:
    return Client().post(
        path, body, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}"
    )


@pytest.mark.parametrize("mode", ["captured", "all"])
def test_a_tickets_and_an_items_words_are_stored_redacted(
    settings: Any, api_token: str, mode: str
) -> None:
    settings.REDACTION = mode
    ticket = {
        "subject": f"Card {CARD} blocked",
        "body": f"Write to {EMAIL} please.",
        "customer": EMAIL,
        "external_id": "T-1",
    }
    assert post("/api/v1/tickets", ticket, api_token).status_code == 201
    stored = Item.objects.get(external_id="T-1")
    assert (stored.subject, stored.body, stored.customer) == (
        "Card [card number] blocked",
        "Write to [email] please.",
        "[email]",
    )
    assert EMAIL not in stored.input_text and "[email]" in stored.input_text

    queue = QueueFactory(slug="answers", n_candidates=2)
    token = token_create(queue=queue, name="app")[1]
    item = {"input": f"Mail {EMAIL}", "metadata": {"mail": EMAIL}, "external_id": "app-1"}
    created = post("/api/v1/items", item, token)
    assert created.status_code == 201
    assert created.json()["input"] == "Mail [email]"
    assert created.json()["metadata"] == {"mail": EMAIL}  # the application's own, as sent


def test_a_placeholder_longer_than_what_it_replaced_still_fits(api_token: str) -> None:
    ticket = {"subject": "x" * 493 + " a@b.co", "body": "Hello.", "external_id": "T-2"}
    assert post("/api/v1/tickets", ticket, api_token).status_code == 201
    assert len(Item.objects.get(external_id="T-2").subject) == 500


def test_with_redaction_off_an_item_keeps_what_was_sent(settings: Any, api_token: str) -> None:
    settings.REDACTION = "off"
    ticket = {"subject": "Card", "body": f"Write to {EMAIL}.", "external_id": "T-3"}
    assert post("/api/v1/tickets", ticket, api_token).status_code == 201
    assert Item.objects.get(external_id="T-3").body == f"Write to {EMAIL}."
