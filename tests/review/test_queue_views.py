from typing import Any

import pytest
from django.test import Client

from icrlhf.generation.models import Candidate, Generation
from icrlhf.queues.models import Item
from tests.factories import CandidateFactory, GenerationFactory

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("url", ["/", "/q/anything/", "/items/1/", "/admin/"])
def test_pages_require_a_login(client: Client, url: str) -> None:
    response = client.get(url)
    assert response.status_code == 302
    assert "/login/" in response["Location"]


def test_the_queue_list_shows_counts(logged_in: Client, queue: Any) -> None:
    Item.objects.create(queue=queue, input_text="a", status=Item.Status.READY)
    page = logged_in.get("/").content.decode()
    assert queue.name in page


def test_creating_an_item_starts_a_generation_with_n_candidates(
    logged_in: Client, queue: Any, django_capture_on_commit_callbacks: Any
) -> None:
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = logged_in.post(f"/q/{queue.slug}/", {"input_text": "  Where is my card?  "})
    item = Item.objects.get()
    assert response["Location"] == f"/items/{item.pk}/"
    assert item.input_text == "Where is my card?"
    assert item.status == Item.Status.GENERATING
    generation = Generation.objects.get(item=item)
    assert generation.n_candidates == queue.n_candidates == 3
    positions = sorted(generation.candidates.values_list("position", flat=True))
    assert positions == [0, 1, 2]
    assert set(generation.candidates.values_list("status", flat=True)) == {"pending"}
    assert len(callbacks) == 1  # the prepare task, enqueued once the item is committed


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"input_text": "   "}, "The input is empty"),
        ({"input_text": "x" * 20_001}, "the limit is 20,000"),
        ({"input_text": "ok", "n_candidates": "9"}, "between 1 and 8, not 9"),
        ({"input_text": "ok", "n_candidates": "0"}, "between 1 and 8, not 0"),
        ({"input_text": "ok", "n_candidates": "many"}, "Enter a whole number"),
    ],
)
def test_bad_input_is_refused_with_a_clear_message(
    logged_in: Client, queue: Any, data: dict[str, str], message: str
) -> None:
    response = logged_in.post(f"/q/{queue.slug}/", data)
    assert response.status_code == 400
    assert message in response.content.decode()
    assert not Item.objects.exists()


def test_the_candidates_partial_polls_until_the_generation_finishes(
    logged_in: Client, queue: Any
) -> None:
    item = Item.objects.create(queue=queue, input_text="q", status=Item.Status.GENERATING)
    generation = GenerationFactory(item=item, n_candidates=2, status=Generation.Status.RUNNING)
    CandidateFactory(generation=generation, position=0, text="first")
    CandidateFactory(generation=generation, position=1, status=Candidate.Status.RUNNING)

    polling = logged_in.get(f"/items/{item.pk}/", HTTP_HX_REQUEST="true")
    assert polling.status_code == 200
    body = polling.content.decode()
    assert 'hx-trigger="every 1s"' in body and "1 of 2 ready" in body
    assert "<html" not in body  # only the partial

    Candidate.objects.filter(position=1).update(status="failed", error="The model is rate-limited")
    Generation.objects.filter(pk=generation.pk).update(status=Generation.Status.DONE)
    Item.objects.filter(pk=item.pk).update(status=Item.Status.READY)
    done = logged_in.get(f"/items/{item.pk}/", HTTP_HX_REQUEST="true")
    assert done.status_code == 286  # htmx stops polling
    body = done.content.decode()
    assert "hx-trigger" not in body
    assert "1 of 2 ready, 1 failed" in body and "The model is rate-limited" in body


def test_llm_output_is_escaped(logged_in: Client, queue: Any) -> None:
    item = Item.objects.create(queue=queue, input_text="<b>hi</b>", status=Item.Status.READY)
    generation = GenerationFactory(
        item=item, messages=[{"role": "user", "content": "<img src=x onerror=alert(2)>"}]
    )
    CandidateFactory(generation=generation, position=0, text="<script>alert(1)</script>")
    page = logged_in.get(f"/items/{item.pk}/").content.decode()
    assert "<script>alert(1)</script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<img src=x" not in page and "<b>hi</b>" not in page


def test_a_ticket_too_long_as_a_whole_is_refused_on_the_form_not_a_server_error(
    logged_in: Client, triage_queue: Any
) -> None:
    from django.conf import settings

    from icrlhf.queues.models import Item

    response = logged_in.post(
        f"/q/{triage_queue.slug}/",
        {"subject": "s" * 500, "body": "b" * settings.ITEM_INPUT_MAX_CHARS, "priority": "normal"},
    )
    assert response.status_code == 400
    assert "the limit is 20,000. Shorten it and try again." in response.content.decode()
    assert not Item.objects.exists()
