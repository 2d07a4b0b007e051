"""Automation through the real worker: a ticket like ones reviewers confirmed is prepared,
generated, ranked in the memory worker (real embeddings) and, confident enough, triaged
without review and sent to the helpdesk; a reviewer undoes it from the item page and
triages it by hand."""

import json

import pytest
from django.test import Client

from icrlhf.generation.models import Calibration
from icrlhf.generation.ranking import FEATURES
from icrlhf.memory.models import Example
from icrlhf.queues.models import Item
from icrlhf.review.models import Automation
from icrlhf.triage.services import ticket_create
from tests.factories import QueueFactory, UserFactory
from tests.integration.test_triage_learning import CARD_TICKETS, CATEGORIES, confirm, ready
from tests.support.processes import WorkerProcess
from tests.support.waiting import wait_for
from tests.support.webhook_receiver import Receiver

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_a_confident_ticket_is_triaged_without_review_then_undone(
    worker_process: WorkerProcess,
) -> None:
    reviewer = UserFactory()
    receiver = Receiver([])
    queue = QueueFactory(
        kind="triage",
        categories=CATEGORIES,
        n_candidates=2,
        k_examples=3,
        memory_candidates=1,
        memory_min_similarity=0.5,
        members=[reviewer],
    )
    for subject, body in CARD_TICKETS:
        item, _ = ticket_create(queue=queue, subject=subject, body=body, source="api")
        confirm(ready(item), reviewer, "card_arrival")
    wait_for(lambda: not Example.objects.exclude(index_state="indexed").exists(), what="indexing")
    # As the periodic refit would leave it: the vote of similar confirmed tickets decides.
    Calibration.objects.create(
        queue=queue,
        features=list(FEATURES),
        coefficients=[-3.0, 8.0] + [0.0] * (len(FEATURES) - 1),
        top_coefficients=[0.0, 1.0],
        items=30,
        candidates=60,
        accepted_share=0.8,
    )
    queue.auto_apply_threshold, queue.audit_percent = 0.9, 0
    queue.webhook_url = receiver.url  # after the confirmations: only what follows is sent
    queue.save()

    ticket, _ = ticket_create(
        queue=queue, subject="No card yet", body="My card still hasn't arrived.", source="api"
    )
    wait_for(
        lambda: Item.objects.get(pk=ticket.pk).status == Item.Status.AUTOMATED,
        timeout_s=60,
        what="automation",
    )
    ticket.refresh_from_db()
    assert ticket.category == "card_arrival" and ticket.ticket_status == "open"
    applied = Automation.objects.get(item=ticket)
    first = ticket.generations.get().candidates.order_by("position").first()
    assert first is not None and applied.candidate == first and first.source == "memory"
    assert applied.confidence == first.confidence and first.confidence > 0.9
    sent = wait_for(lambda: receiver.requests, what="the webhook")
    body = json.loads(sent[-1][1])
    assert (body["event"], body["automated"], body["triage"]["category"]) == (
        "ticket.triaged",
        True,
        "card_arrival",
    )

    client = Client()
    client.force_login(reviewer)
    page = client.get(f"/items/{ticket.pk}/").content.decode()
    assert "Applied automatically" in page and "likely" in page
    client.post(f"/automations/{applied.pk}/undo/")
    ticket.refresh_from_db()
    assert (ticket.status, ticket.category) == ("ready", "")
    wait_for(lambda: len(receiver.requests) == 2, what="the undo's webhook")
    assert json.loads(receiver.requests[-1][1])["event"] == "ticket.triage_undone"

    confirm(ticket, reviewer, "lost_or_stolen_card")  # back in review, decided by hand
    ticket.refresh_from_db()
    assert (ticket.status, ticket.category) == ("decided", "lost_or_stolen_card")
