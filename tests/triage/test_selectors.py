"""The triage queue's ticket list: its free-text search, its channel drop-down, and subjects
shown whole."""

from typing import Any

import pytest
from django.test import Client

from icrlhf.queues.models import Item
from tests.factories import ItemFactory, QueueFactory, UserFactory

pytestmark = pytest.mark.django_db


def ticket(queue: Any, subject: str, **fields: Any) -> Item:
    values = {"body": f"About: {subject}.", "channel": "email", **fields}
    return ItemFactory(queue=queue, subject=subject, input_text=subject, **values)


def listed(client: Client, queue: Any, **query: str) -> str:
    response = client.get(f"/q/{queue.slug}/", query)
    assert response.status_code == 200
    return response.content.decode()


def test_the_search_finds_words_in_subject_body_customer_or_the_ticket_number(
    triage_queue: Any, logged_in: Client
) -> None:
    ticket(triage_queue, "Card never arrived", customer="ana@example.com")
    refund = ticket(triage_queue, "Refund missing", body="The refund for order 881 is late.")
    ticket(QueueFactory(kind="triage"), "Card never arrived in the other queue")

    assert "Card never arrived" in listed(logged_in, triage_queue, search="NEVER")
    assert "Refund missing" not in listed(logged_in, triage_queue, search="never")
    assert "Refund missing" in listed(logged_in, triage_queue, search="order 881")
    assert "Card never arrived" in listed(logged_in, triage_queue, search="ana@example")
    by_number = listed(logged_in, triage_queue, search=f"#{refund.pk}")
    assert "Refund missing" in by_number and "Card never arrived" not in by_number
    nothing = listed(logged_in, triage_queue, search="card refund")  # every word must match
    assert "No tickets match." in nothing
    assert "in the other queue" not in listed(logged_in, triage_queue, search="card")


def test_the_search_term_is_shown_back_escaped(triage_queue: Any, logged_in: Client) -> None:
    page = listed(logged_in, triage_queue, search='<script>alert("x")</script>')
    assert '<script>alert("x")</script>' not in page
    assert "&lt;script&gt;" in page


def test_channel_is_a_drop_down_of_the_queues_channels(
    triage_queue: Any, logged_in: Client
) -> None:
    ticket(triage_queue, "By mail", channel="Email")
    ticket(triage_queue, "By chat", channel="chat")
    ticket(triage_queue, "No channel", channel="")
    ticket(QueueFactory(kind="triage"), "Elsewhere", channel="fax")

    page = listed(logged_in, triage_queue)
    assert '<select name="channel"' in page
    options = page.split('<select name="channel"')[1].split("</select>")[0]
    assert [line.split(">")[1].split("<")[0] for line in options.split("<option")[1:]] == [
        "Any channel",
        "chat",
        "email",
    ]
    mail = listed(logged_in, triage_queue, channel="email")
    assert "By mail" in mail and "By chat" not in mail


def test_a_channel_no_ticket_has_any_more_leaves_the_other_filters_applied(
    triage_queue: Any, logged_in: Client
) -> None:
    ticket(triage_queue, "Urgent one", priority="urgent")
    ticket(triage_queue, "Normal one")
    page = listed(logged_in, triage_queue, channel="fax", priority="urgent")
    assert "Urgent one" in page and "Normal one" not in page
    assert "Select a valid choice" in page


def test_subjects_are_shown_whole_with_the_start_of_the_body(
    triage_queue: Any, logged_in: Client
) -> None:
    subject = "My card payment abroad used the wrong exchange rate and I was charged twice"
    ticket(triage_queue, subject, body="I paid 40 EUR in Lisbon yesterday. " * 10)
    page = listed(logged_in, triage_queue)
    assert subject in page
    assert "I paid 40 EUR in Lisbon yesterday." in page
    assert "I paid 40 EUR in Lisbon yesterday. " * 10 not in page  # the body, shortened


def test_the_list_is_only_for_the_queues_members(triage_queue: Any, client: Client) -> None:
    client.force_login(UserFactory())
    assert client.get(f"/q/{triage_queue.slug}/", {"search": "card"}).status_code == 404
