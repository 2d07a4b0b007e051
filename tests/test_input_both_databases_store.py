"""Input that SQLite stores and PostgreSQL refuses gets the same clear behaviour on both.

A NUL character (0x00) in text is refused with a clear message on every path that takes text,
and nothing is saved; a time with an offset beyond ±15:59 is taken as the same instant in UTC."""

import json
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from icrlhf.ingest.importing import tickets_import
from icrlhf.integrations import llm
from icrlhf.queues.models import Item
from icrlhf.review.models import Decision
from tests.factories import ItemFactory, UserFactory, ready_generation

pytestmark = pytest.mark.django_db

TICKET = {"subject": "Card not here", "body": "It has not arrived."}


def api_post(client: Client, path: str, body: object, token: str) -> Any:
    return client.post(
        path, body, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}"
    )


@pytest.mark.parametrize("field", ["subject", "body", "customer", "channel", "external_id"])
def test_the_api_refuses_a_ticket_with_a_nul_in_any_field(
    client: Client, api_token: str, field: str
) -> None:
    response = api_post(client, "/api/v1/tickets", {**TICKET, field: "a\x00b"}, api_token)
    assert response.status_code == 422
    assert response.json()["errors"] == [
        {"field": field, "message": "must not contain NUL (0x00) characters"}
    ]
    assert not Item.objects.exists()


def test_a_batch_with_one_nul_saves_nothing_and_names_the_ticket(
    client: Client, api_token: str
) -> None:
    batch = {"tickets": [TICKET, {**TICKET, "body": "\x00"}]}
    response = api_post(client, "/api/v1/tickets/batch", batch, api_token)
    assert response.status_code == 422
    assert response.json()["errors"][0]["field"] == "tickets.1.body"
    assert not Item.objects.exists()


def test_an_import_reports_the_row_with_a_nul_and_imports_the_others(triage_queue: Any) -> None:
    data = b"subject,body\nfine,all good\nbad,has a \x00 in it\n"
    report = tickets_import(queue=triage_queue, data=data, filename="t.csv")
    assert report.created == 1
    assert [(p.row, "NUL (0x00)" in p.message) for p in report.problems] == [(3, True)]
    assert Item.objects.get().subject == "fine"


def test_an_api_query_with_a_nul_is_refused(client: Client, api_token: str) -> None:
    response = client.get(
        "/api/v1/exports/preferences?reviewer=a%00b", HTTP_AUTHORIZATION=f"Bearer {api_token}"
    )
    assert response.status_code == 400
    assert "NUL (0x00)" in response.json()["detail"]


def test_the_login_form_refuses_a_nul_without_a_server_error(client: Client) -> None:
    response = client.post("/accounts/login/", {"username": "a\x00", "password": "x"})
    assert response.status_code == 400
    assert b"NUL (0x00)" in response.content


def test_a_decision_with_a_nul_in_the_edited_text_is_refused_and_nothing_is_saved(
    logged_in: Client, queue: Any
) -> None:
    item = ItemFactory(queue=queue)
    generation = ready_generation(item, texts=["one", "two"])
    candidate = generation.candidates.first()
    response = logged_in.post(
        f"/items/{item.pk}/decide/",
        {"choice": f"c{candidate.pk}", f"final_text_{candidate.pk}": "edited \x00 text"},
    )
    assert response.status_code == 400
    assert not Decision.objects.exists()


def test_a_nul_in_a_model_answer_is_dropped_not_stored() -> None:
    completion = llm.complete(
        messages=[{"role": "user", "content": "hi"}],
        model="openai/test-model",
        params={},
        mock_response="an\x00swer",
    )
    assert completion.text == "answer"


def test_a_time_with_an_offset_postgresql_cannot_store_is_taken_as_the_same_instant(
    client: Client, api_token: str
) -> None:
    """ISO 8601 and Python allow +16:00; PostgreSQL does not. The same instant in UTC works
    on both databases."""
    ticket = {**TICKET, "sla_due_at": "2030-01-02T00:00:00+16:00"}
    response = api_post(client, "/api/v1/tickets", ticket, api_token)
    assert response.status_code == 201
    assert Item.objects.get().sla_due_at.isoformat() == "2030-01-01T08:00:00+00:00"
    export = client.get(
        "/api/v1/exports/preferences?decided_from=2000-01-01T00%3A00%3A00%2B16%3A00",
        HTTP_AUTHORIZATION=f"Bearer {api_token}",
    )
    assert export.status_code == 200


@pytest.mark.parametrize("when", ["0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-12:00"])
def test_a_time_beyond_the_calendar_in_utc_is_refused_or_bounded_not_a_server_error(
    client: Client, api_token: str, when: str
) -> None:
    response = api_post(client, "/api/v1/tickets", {**TICKET, "sla_due_at": when}, api_token)
    assert response.status_code == 422
    assert response.json()["errors"] == [
        {"field": "sla_due_at", "message": "Value error, is out of range"}
    ]
    assert not Item.objects.exists()
    for bound in ("decided_from", "decided_to"):
        export = client.get(
            f"/api/v1/exports/preferences?{bound}={when.replace('+', '%2B')}",
            HTTP_AUTHORIZATION=f"Bearer {api_token}",
        )
        assert export.status_code == 200


def test_an_import_with_times_beyond_the_calendar_and_overlong_tickets_reports_each_row(
    client: Client, triage_queue: Any
) -> None:
    """The rows around the bad ones are imported; each bad one is listed; no server error."""
    curator = UserFactory()
    triage_queue.members.add(curator, through_defaults={"role": "curator"})
    client.force_login(curator)
    rows = [
        {"subject": "first", "body": "fine"},
        {"subject": "early", "body": "x", "sla_due_at": "0001-01-01T00:00:00+14:00"},
        {"subject": "late", "body": "x", "sla_due_at": "9999-12-31T23:59:59-12:00"},
        {"subject": "s" * 500, "body": "b" * 20_000},
        {"subject": "s" * 501, "body": "b"},
        {"subject": "last", "body": "fine"},
    ]
    data = "\n".join(json.dumps(row) for row in rows).encode()
    upload = SimpleUploadedFile("t.jsonl", data, content_type="application/x-ndjson")
    response = client.post(f"/q/{triage_queue.slug}/import/", {"file": upload})
    assert response.status_code == 200
    page = response.content.decode()
    assert "<strong>2</strong> imported" in page and "<strong>4</strong> refused" in page
    assert page.count("is out of range") == 2
    assert sorted(Item.objects.values_list("subject", flat=True)) == ["first", "last"]
