"""Adding a queue kind is its package and one line: a kind defined under tests/, installed
by that line, works through every flow (created, ingested through the API, shown on the queue
page and the item page, decided) with no other code knowing its name."""

from typing import Any

import pytest
from django.test import Client

from icrlhf import kinds
from icrlhf.generation import pipeline
from icrlhf.ingest.services import token_create
from icrlhf.queues.models import Item
from icrlhf.review.models import Decision
from tests.factories import QueueFactory
from tests.kinds.echo_kind import ECHO_INSTRUCTIONS, EchoKind

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def echo_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    # The one line, as a real kind adds it to INSTALLED_KINDS in icrlhf/kinds/__init__.py.
    installed = (*kinds.INSTALLED_KINDS, "tests.kinds.echo_kind.EchoKind")
    monkeypatch.setattr(kinds, "KINDS", kinds.kinds_load(installed))


@pytest.fixture
def echo_queue(user: Any) -> Any:
    return QueueFactory(kind=EchoKind.name, n_candidates=2, members=[user])


def test_the_line_installs_the_kind_by_its_name(echo_queue: Any) -> None:
    assert isinstance(kinds.kind_of(echo_queue), EchoKind)


def test_an_echo_item_goes_from_the_api_to_a_decision(
    echo_queue: Any,
    logged_in: Client,
    llm_answer: Any,
    django_capture_on_commit_callbacks: Any,
) -> None:
    token = token_create(queue=echo_queue, name="app")[1]
    with django_capture_on_commit_callbacks(execute=False):  # its generation is run below
        created = Client().post(
            "/api/v1/items",
            {"input": "Where is my card?", "external_id": "echo-1"},
            content_type="application/json",
            HTTP_AUTHORIZATION=f"Bearer {token}",
        )
    assert created.status_code == 201
    item = Item.objects.get(pk=created.json()["id"])
    assert (item.queue_id, item.input_text) == (echo_queue.pk, "Where is my card?")
    assert item.subject == ""  # an item, not a ticket

    generation = item.generations.get()
    pipeline.generation_prepare(generation_id=generation.pk)
    llm_answer("Where is my card?")
    for candidate in generation.candidates.all():
        pipeline.candidate_generate(candidate_id=candidate.pk)
    generation.refresh_from_db()
    assert ECHO_INSTRUCTIONS in str(generation.messages)  # the kind's own prompt

    queue_page = logged_in.get(f"/q/{echo_queue.slug}/").content.decode()
    assert "Recent items" in queue_page and "Where is my card?" in queue_page

    item_page = logged_in.get(f"/items/{item.pk}/").content.decode()
    picked = generation.candidates.order_by("position").first()
    assert picked is not None and f'value="c{picked.pk}"' in item_page

    decided = logged_in.post(f"/items/{item.pk}/decide/", {"choice": f"c{picked.pk}"}, follow=True)
    assert f"Saved item {item.pk}: chosen." in decided.content.decode()
    decision = Decision.objects.get(item=item)
    assert (decision.verdict, decision.final_text) == ("chosen", "Where is my card?")


def test_the_review_page_names_what_the_kind_calls_its_items(
    logged_in: Client, echo_queue: Any, triage_queue: Any
) -> None:
    # With nothing left to review, the page offers to add one more.
    echo_page = logged_in.get(f"/q/{echo_queue.slug}/review/").content.decode()
    assert "Add a new item</a>" in echo_page
    triage_page = logged_in.get(f"/q/{triage_queue.slug}/review/").content.decode()
    assert "Add a new ticket</a>" in triage_page
