"""The proposals page: curators only, each change decided by a POST with the CSRF token, the
reflector's words escaped, another queue's changes out of reach."""

import json
from typing import Any

import pytest
from django.test import Client

from icrlhf.reflection import services
from icrlhf.reflection.models import Mutation, Proposal
from tests.factories import QueueFactory, UserFactory, playbook_write, ranked_decision
from tests.support.llm_answer import LLMAnswer

pytestmark = pytest.mark.django_db


def _client(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def proposed(llm_answer: LLMAnswer) -> tuple[Any, Any, Proposal]:
    curator, reviewer = UserFactory(), UserFactory()
    queue = QueueFactory(curators=[curator], members=[reviewer])
    playbook_write(queue, [("Tone", "Be brief.")])
    ranked_decision(queue, reviewer, pick_first=False)
    proposal = services.proposal_start(queue_id=queue.pk)
    llm_answer(
        json.dumps(
            {
                "mutations": [
                    {
                        "op": "edit",
                        "entry": "E1",
                        "section": "Tone",
                        "text": "Be brief and kind.",
                        "cites": [1],
                        "why": "<script>alert(1)</script>",
                    }
                ]
            }
        )
    )
    services.proposal_reflect(proposal_id=proposal.pk)
    return queue, curator, proposal


def test_only_curators_see_and_decide(proposed: tuple[Any, Any, Proposal]) -> None:
    queue, curator, proposal = proposed
    reviewer = queue.members.exclude(pk=curator.pk).get()
    mutation = Mutation.objects.get()
    base = f"/q/{queue.slug}/playbook"
    assert _client(reviewer).get(f"{base}/proposals/").status_code == 403
    for url in (
        f"{base}/reflect/",
        f"{base}/changes/{mutation.pk}/",
        f"{base}/proposals/{proposal.pk}/apply/",
    ):
        assert _client(reviewer).post(url, {"verdict": "approve"}).status_code == 403
        assert _client(UserFactory()).post(url, {"verdict": "approve"}).status_code == 404
    mutation.refresh_from_db()
    assert mutation.status == Mutation.Status.PENDING


def test_a_curator_reads_the_diff_approves_and_applies(proposed: tuple[Any, Any, Proposal]) -> None:
    queue, curator, proposal = proposed
    client = _client(curator)
    page = client.get(f"/q/{queue.slug}/playbook/proposals/").content.decode()
    assert "<ins>" in page and "kind." in page  # the edit as a word diff
    assert "<script>alert(1)</script>" not in page and "&lt;script&gt;" in page
    mutation = Mutation.objects.get()
    client.post(f"/q/{queue.slug}/playbook/changes/{mutation.pk}/", {"verdict": "approve"})
    applied = client.post(f"/q/{queue.slug}/playbook/proposals/{proposal.pk}/apply/")
    assert applied.status_code == 302 and applied["Location"] == f"/q/{queue.slug}/playbook/"
    assert "Be brief and kind." in client.get(applied["Location"]).content.decode()


def test_another_queues_curator_cannot_decide_this_queues_change(
    proposed: tuple[Any, Any, Proposal],
) -> None:
    queue, _curator, _proposal = proposed
    other_curator = UserFactory()
    other = QueueFactory(curators=[other_curator])
    mutation = Mutation.objects.get()
    _client(other_curator).post(
        f"/q/{other.slug}/playbook/changes/{mutation.pk}/", {"verdict": "approve"}
    )
    mutation.refresh_from_db()
    assert mutation.status == Mutation.Status.PENDING


def test_deciding_needs_the_csrf_token(proposed: tuple[Any, Any, Proposal]) -> None:
    queue, curator, _proposal = proposed
    client = Client(enforce_csrf_checks=True)
    client.force_login(curator)
    mutation = Mutation.objects.get()
    refused = client.post(f"/q/{queue.slug}/playbook/changes/{mutation.pk}/", {"verdict": "reject"})
    assert refused.status_code == 403
