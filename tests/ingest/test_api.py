from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from icrlhf.ingest.models import IntegrationToken
from icrlhf.queues.models import Item
from tests.factories import QueueFactory

pytestmark = pytest.mark.django_db

TICKET = {
    "subject": "Card not here",
    "body": "I ordered a card two weeks ago and it has not arrived.",
    "customer": "ana@example.com",
    "channel": "email",
    "priority": "high",
    "external_id": "zd-1001",
}


def post(client: Client, path: str, body: object, token: str | None) -> Any:
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token else {}
    return client.post(path, body, content_type="application/json", **headers)


@pytest.mark.parametrize("token", [None, "nope", "icr_not-a-real-token"])
def test_the_api_needs_a_valid_token(client: Client, token: str | None) -> None:
    response = post(client, "/api/v1/tickets", TICKET, token)
    assert response.status_code == 401
    assert not Item.objects.exists()


def test_a_revoked_token_is_refused(client: Client, api_token: str) -> None:
    IntegrationToken.objects.update(revoked_at=timezone.now())
    assert post(client, "/api/v1/tickets", TICKET, api_token).status_code == 401


def test_a_ticket_is_created_with_its_sla_and_queued_for_triage(
    client: Client, api_token: str, triage_queue: Any, django_capture_on_commit_callbacks: Any
) -> None:
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = post(client, "/api/v1/tickets", TICKET, api_token)
    assert response.status_code == 201
    body = response.json()
    item = Item.objects.get()
    assert body["id"] == item.pk and body["created"] is True
    assert (body["status"], body["review_status"], body["priority"]) == (
        "new",
        "generating",
        "high",
    )
    assert item.queue == triage_queue and item.source == "api"
    assert item.input_text == f"{TICKET['subject']}\n\n{TICKET['body']}"
    assert item.sla_due_at is not None
    assert 3.9 * 3600 < (item.sla_due_at - item.created_at).total_seconds() <= 4 * 3600 + 5
    assert len(callbacks) == 1  # the triage generation


def test_sending_the_same_external_id_again_changes_nothing(client: Client, api_token: str) -> None:
    first = post(client, "/api/v1/tickets", TICKET, api_token)
    again = post(client, "/api/v1/tickets", {**TICKET, "subject": "changed"}, api_token)
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["id"] == first.json()["id"] and again.json()["created"] is False
    assert Item.objects.count() == 1 and Item.objects.get().subject == "Card not here"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"subject": ""}, "subject"),
        ({"subject": "   "}, "subject"),
        ({"body": None}, "body"),
        ({"priority": "asap"}, "priority"),
        ({"sla_due_at": "2026-13-40"}, "sla_due_at"),
        ({"sla_due_at": "2026-11-21T10:00:00"}, "sla_due_at"),
        ({"external_id": "x" * 201}, "external_id"),
    ],
)
def test_validation_errors_are_clear_json(
    client: Client, api_token: str, change: dict[str, object], field: str
) -> None:
    response = post(client, "/api/v1/tickets", {**TICKET, **change}, api_token)
    assert response.status_code == 422
    body = response.json()
    assert body["detail"] == "The request is invalid; nothing was saved."
    assert [e["field"] for e in body["errors"]] == [field]
    assert all(e["message"] for e in body["errors"])
    assert not Item.objects.exists()


def test_an_unknown_category_is_refused(client: Client, api_token: str) -> None:
    response = post(client, "/api/v1/tickets", {**TICKET, "category": "mortgages"}, api_token)
    assert response.status_code == 422
    assert "not one of the queue's categories" in response.json()["detail"]


def test_a_batch_is_created_whole(client: Client, api_token: str) -> None:
    tickets = [{**TICKET, "external_id": f"zd-{n}"} for n in range(3)]
    response = post(client, "/api/v1/tickets/batch", {"tickets": tickets}, api_token)
    assert response.status_code == 201
    assert [t["external_id"] for t in response.json()] == ["zd-0", "zd-1", "zd-2"]
    again = post(client, "/api/v1/tickets/batch", {"tickets": tickets}, api_token)
    assert again.status_code == 201 and [t["created"] for t in again.json()] == [False] * 3
    assert Item.objects.count() == 3


def test_a_batch_with_one_bad_ticket_saves_nothing(client: Client, api_token: str) -> None:
    tickets = [{**TICKET, "external_id": "ok"}, {**TICKET, "external_id": "bad", "category": "x"}]
    response = post(client, "/api/v1/tickets/batch", {"tickets": tickets}, api_token)
    assert response.status_code == 422
    assert response.json()["errors"][0]["field"] == "tickets.1"
    schema_bad = post(client, "/api/v1/tickets/batch", {"tickets": [{"subject": "x"}]}, api_token)
    assert schema_bad.status_code == 422
    assert schema_bad.json()["errors"][0]["field"] == "tickets.0.body"
    too_many = post(client, "/api/v1/tickets/batch", {"tickets": [TICKET] * 101}, api_token)
    assert too_many.status_code == 422
    assert not Item.objects.exists()


def test_a_token_reads_only_its_own_queues_tickets(client: Client, api_token: str) -> None:
    created = post(client, "/api/v1/tickets", TICKET, api_token).json()
    headers = {"HTTP_AUTHORIZATION": f"Bearer {api_token}"}
    assert client.get(f"/api/v1/tickets/{created['id']}", **headers).json()["subject"] == (
        "Card not here"
    )
    other = Item.objects.create(queue=QueueFactory(), input_text="elsewhere")
    assert client.get(f"/api/v1/tickets/{other.pk}", **headers).status_code == 404


def test_the_api_docs_are_for_logged_in_people(client: Client, logged_in: Client) -> None:
    assert client.get("/api/v1/docs").status_code == 302
    docs = logged_in.get("/api/v1/docs")
    assert docs.status_code == 200
    schema = logged_in.get("/api/v1/openapi.json").json()
    assert "/api/v1/tickets" in schema["paths"]
    assert "cdn" not in docs.content.decode().lower()


def test_a_general_queue_s_token_cannot_create_tickets(client: Client, db: None) -> None:
    from icrlhf.ingest.services import token_create

    general = QueueFactory(name="Writing help")
    token = token_create(queue=general, name="tests")[1]
    response = post(client, "/api/v1/tickets", TICKET, token)
    assert response.status_code == 422
    assert "not a triage queue" in response.json()["detail"]
    assert not Item.objects.exists()


@pytest.mark.parametrize("path", ["/api/v1/tickets", "/api/v1/tickets/batch"])
def test_json_sent_as_plain_text_is_refused(client: Client, api_token: str, path: str) -> None:
    import json

    body = {"tickets": [TICKET]} if path.endswith("batch") else TICKET
    response = client.post(
        path,
        json.dumps(body),
        content_type="text/plain",
        HTTP_AUTHORIZATION=f"Bearer {api_token}",
    )
    assert response.status_code == 415
    assert "Content-Type: application/json" in response.json()["detail"]
    assert not Item.objects.exists()
