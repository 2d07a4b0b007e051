"""The items API, for every kind of queue, and the decision webhook for a general queue."""

import hashlib
import hmac
import json
from typing import Any

import pytest
from django.test import Client

from icrlhf.ingest.services import token_create
from icrlhf.queues.models import Item
from icrlhf.review import decisions
from icrlhf.review import tasks as review_tasks
from tests.factories import QueueFactory, UserFactory, ready_generation
from tests.support.webhook_receiver import Receiver

pytestmark = pytest.mark.django_db


def post(client: Client, path: str, body: object, token: str) -> Any:
    return client.post(
        path, body, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}"
    )


def get(client: Client, path: str, token: str) -> Any:
    return client.get(path, HTTP_AUTHORIZATION=f"Bearer {token}")


@pytest.fixture
def general(db: None) -> tuple[Any, str]:
    queue = QueueFactory(slug="answers", n_candidates=2)
    return queue, token_create(queue=queue, name="app")[1]


def test_an_item_is_created_once_per_external_id_and_read_back(
    client: Client, general: tuple[Any, str], django_capture_on_commit_callbacks: Any
) -> None:
    queue, token = general
    body = {"input": "What is the fee?", "metadata": {"user": 42}, "external_id": "app-1"}
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        created = post(client, "/api/v1/items", body, token)
    assert created.status_code == 201 and len(callbacks) == 1  # its generation, enqueued
    item = created.json()
    assert (item["input"], item["metadata"], item["source"]) == (body["input"], {"user": 42}, "api")
    assert item["status"] == "generating" and item["created"] is True
    assert [c["status"] for c in item["candidates"]] == ["pending", "pending"]
    assert item["decision"] is None and item["final_text"] is None

    again = post(client, "/api/v1/items", body, token)
    assert again.status_code == 200 and again.json()["id"] == item["id"]
    assert again.json()["created"] is False and Item.objects.filter(queue=queue).count() == 1


def test_a_decided_item_reads_with_its_decision_and_final_text(
    client: Client, general: tuple[Any, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    queue, token = general
    monkeypatch.setattr(decisions, "_memory_teach", lambda decision: None)  # no store needed
    reviewer = UserFactory()
    item = Item.objects.create(queue=queue, input_text="Fee?", status=Item.Status.READY)
    generation = ready_generation(item, ["One euro.", "Two euros."])
    picked = generation.candidates.get(position=1)
    decisions.decision_record(
        item_id=item.pk,
        reviewer=reviewer,
        verdict="chosen",
        candidate_id=picked.pk,
        final_text="Two euros, once a month.",
    )
    read = get(client, f"/api/v1/items/{item.pk}", token).json()
    assert read["status"] == "decided" and read["final_text"] == "Two euros, once a month."
    assert read["decision"]["verdict"] == "edited"
    assert read["decision"]["candidate_id"] == picked.pk
    assert [c["text"] for c in read["candidates"]] == ["One euro.", "Two euros."]


def test_a_batch_is_all_or_nothing(client: Client, general: tuple[Any, str], settings: Any) -> None:
    queue, token = general
    ok = post(client, "/api/v1/items/batch", {"items": [{"input": "A"}, {"input": "B"}]}, token)
    assert ok.status_code == 201 and [i["input"] for i in ok.json()] == ["A", "B"]
    # Refused by the service, after the first entry was created: that one is rolled back.
    settings.ITEM_INPUT_MAX_CHARS = 10
    bad = post(
        client,
        "/api/v1/items/batch",
        {"items": [{"input": "C"}, {"input": "Longer than ten"}]},
        token,
    )
    assert bad.status_code == 422
    assert bad.json()["errors"] == [
        {
            "field": "items.1",
            "message": "The input has 15 characters; the limit is 10. Shorten it and try again.",
        }
    ]
    assert sorted(Item.objects.filter(queue=queue).values_list("input_text", flat=True)) == [
        "A",
        "B",
    ]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"input": "   "}, "input"),
        ({"input": "a\x00b"}, "input"),
        ({"input": "ok", "metadata": {"blob": "x" * 20_000}}, "metadata"),
        ({"input": "ok", "metadata": ["not", "an", "object"]}, "metadata"),
    ],
)
def test_bad_items_say_which_field_and_save_nothing(
    client: Client, general: tuple[Any, str], body: dict[str, Any], field: str
) -> None:
    response = post(client, "/api/v1/items", body, general[1])
    assert response.status_code == 422
    assert response.json()["errors"][0]["field"] == field
    assert not Item.objects.exists()


def test_metadata_that_is_not_plain_json_is_refused(
    client: Client, general: tuple[Any, str]
) -> None:
    body = '{"input": "ok", "metadata": {"score": NaN}}'
    response = post(client, "/api/v1/items", body, general[1])
    assert response.status_code == 422
    [problem] = response.json()["errors"]
    assert problem["field"] == "metadata.score"
    assert "must be a finite number" in problem["message"]
    assert not Item.objects.exists()


def test_a_token_reads_and_writes_its_own_queue_only(
    client: Client, general: tuple[Any, str]
) -> None:
    queue, token = general
    other = QueueFactory()
    theirs = Item.objects.create(queue=other, input_text="Theirs")
    assert get(client, f"/api/v1/items/{theirs.pk}", token).status_code == 404
    mine = post(client, "/api/v1/items", {"input": "Mine"}, token).json()
    assert Item.objects.get(pk=mine["id"]).queue == queue


def test_a_triage_queue_files_the_input_as_a_ticket(client: Client, triage_queue: Any) -> None:
    token = token_create(queue=triage_queue, name="app")[1]
    body = {"input": "Card not here\nOrdered two weeks ago.", "metadata": {"crm": "x"}}
    response = post(client, "/api/v1/items", body, token)
    assert response.status_code == 201
    item = Item.objects.get(pk=response.json()["id"])
    assert (item.subject, item.body, item.metadata) == (
        "Card not here",
        "Ordered two weeks ago.",
        {"crm": "x"},
    )
    assert item.sla_due_at is not None

    one_line = post(client, "/api/v1/items", {"input": "Card lost"}, token).json()
    assert Item.objects.values_list("subject", "body").get(pk=one_line["id"]) == ("Card lost", "")
    long_line = "x" * 600
    long = post(client, "/api/v1/items", {"input": long_line}, token).json()
    subject, body = Item.objects.values_list("subject", "body").get(pk=long["id"])
    assert len(subject) == 500 and subject.endswith("…") and body == long_line


def test_the_items_api_is_in_the_openapi_docs(logged_in: Client) -> None:
    paths = logged_in.get("/api/v1/openapi.json").json()["paths"]
    assert {"/api/v1/items", "/api/v1/items/batch", "/api/v1/items/{item_id}"} <= set(paths)


def test_a_general_queues_decision_and_its_undo_are_posted_signed(
    general: tuple[Any, str],
    monkeypatch: pytest.MonkeyPatch,
    django_capture_on_commit_callbacks: Any,
) -> None:
    queue, _token = general
    receiver = Receiver([])
    queue.webhook_url, queue.webhook_secret = receiver.url, "s3cret"
    queue.save()
    monkeypatch.setattr(decisions, "_memory_teach", lambda decision: None)
    monkeypatch.setattr(
        review_tasks.decision_webhook,
        "delay",
        lambda *args: review_tasks.decision_webhook.apply(args=args),
    )
    reviewer = UserFactory()
    item = Item.objects.create(
        queue=queue,
        input_text="Fee?",
        status=Item.Status.READY,
        external_id="app-7",
        metadata={"user": 1},
    )
    generation = ready_generation(item, ["One euro.", "Two euros."])
    with django_capture_on_commit_callbacks(execute=True):
        decision = decisions.decision_record(
            item_id=item.pk,
            reviewer=reviewer,
            verdict="chosen",
            candidate_id=generation.candidates.get(position=0).pk,
        )
    with django_capture_on_commit_callbacks(execute=True):
        decisions.decision_undo(decision_id=decision.pk, reviewer=reviewer)
    receiver.server.shutdown()

    (decided_headers, decided_body), (undone_headers, undone_body) = receiver.requests
    signed = decided_headers["X-Icrlhf-Timestamp"].encode() + b"." + decided_body
    expected = "sha256=" + hmac.new(b"s3cret", signed, hashlib.sha256).hexdigest()
    assert decided_headers["X-Icrlhf-Signature"] == expected
    assert [decided_headers["X-Icrlhf-Event"], undone_headers["X-Icrlhf-Event"]] == [
        "item.decided",
        "item.decision_undone",
    ]
    decided, undone = json.loads(decided_body), json.loads(undone_body)
    assert decided["item"]["external_id"] == "app-7" and decided["item"]["metadata"] == {"user": 1}
    assert (decided["verdict"], decided["final_text"]) == ("chosen", "One euro.")
    assert decided["served_accepted"] is False and decided["undone_at"] is None
    assert undone["undone_at"] is not None and undone["item"]["status"] == "ready"


def test_a_triage_none_of_whose_answers_was_acceptable_is_not_posted_as_triaged(
    triage_queue: Any, monkeypatch: pytest.MonkeyPatch, django_capture_on_commit_callbacks: Any
) -> None:
    sent: list[tuple[Any, ...]] = []
    monkeypatch.setattr(review_tasks.decision_webhook, "delay", lambda *args: sent.append(args))
    monkeypatch.setattr(decisions, "_memory_teach", lambda decision: None)
    triage_queue.webhook_url = "http://127.0.0.1:9/hook"
    triage_queue.save()
    reviewer = UserFactory()
    item = Item.objects.create(queue=triage_queue, input_text="Card?", status=Item.Status.READY)
    ready_generation(item, ["not json"])
    with django_capture_on_commit_callbacks(execute=True):
        decision = decisions.decision_record(
            item_id=item.pk, reviewer=reviewer, verdict="none_acceptable"
        )
    with django_capture_on_commit_callbacks(execute=True):
        decisions.decision_undo(decision_id=decision.pk, reviewer=reviewer)
    assert sent == []
