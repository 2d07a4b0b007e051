"""Queues as tenants (issue 27): memory keyed by the queue's id, roles per membership (and
their migration from install-wide groups), token scopes, a token shown through the session
only, and claims that only a POST takes."""

import importlib
import json
from pathlib import Path
from typing import Any

import pytest
from django.apps import apps
from django.contrib.admin.sites import site
from django.contrib.auth.models import Group, Permission
from django.forms.models import model_to_dict
from django.test import Client, RequestFactory

from icrlhf.ingest.models import IntegrationToken
from icrlhf.integrations import llm, vectors
from icrlhf.memory import index
from icrlhf.memory.selectors import examples_recall
from icrlhf.queues.access import can_curate, can_review, role_in
from icrlhf.queues.models import Membership, Queue
from icrlhf.review.models import Claim
from tests.factories import (
    ItemFactory,
    QueueFactory,
    UserFactory,
    decided_and_indexed,
    ready_generation,
)
from tests.support.fixed_latency_llm import FixedLatencyLLM

pytestmark = pytest.mark.django_db

roles_migration = importlib.import_module("icrlhf.queues.migrations.0008_membership_roles")


def test_a_renamed_queue_keeps_its_memory_and_its_old_slug_reaches_none_of_it(
    user: Any, vector_store: Path
) -> None:
    """Queue V is renamed and its old slug given to queue M: V's examples stay V's, and M
    retrieves none of them (collections are named by id; rows are loaded per queue)."""
    victim = QueueFactory(slug="support", members=[user])
    decided_and_indexed(
        victim, user, "My card has not arrived yet.", "Customer 4411: it ships Monday."
    )
    victim.slug = "support-old"
    victim.save()
    mallory = QueueFactory(slug="support", members=[user], min_similarity=-1.0)
    decided_and_indexed(mallory, user, "Unrelated question?", "Mallory's own answer.")

    def answers(queue: Any) -> list[str]:
        recall = examples_recall(
            queue=queue, query_text="Where is my card?", k=5, token_budget=10_000, pool=5
        )
        return [r.example.output_text for r in [*recall.examples, *recall.neighbours]]

    assert "Customer 4411: it ships Monday." not in answers(mallory)
    assert set(answers(victim)) == {"Customer 4411: it ships Monday."}
    assert index.collection_of(victim.pk) != index.collection_of(mallory.pk)


def test_a_point_of_another_queue_in_a_collection_is_never_used(
    user: Any, vector_store: Path
) -> None:
    """Defence in depth: even a collection holding another queue's point (a store shared
    wrongly) yields only this queue's rows."""
    mine, other = QueueFactory(members=[user]), QueueFactory(members=[user])
    [foreign, *_] = decided_and_indexed(other, user, "Where is my card?", "Other queue's answer.")
    stray_vector = vectors.vectors_of(collection=index.collection_of(other.pk), ids=[foreign.pk])
    vectors.upsert(  # the other queue's point, in this queue's collection, claiming to be its
        collection=index.collection_of(mine.pk),
        points=[
            vectors.Point(
                id=foreign.pk,
                vector=stray_vector[foreign.pk],
                payload={"queue_id": mine.pk, "role": "preferred", "status": "active"},
            )
        ],
    )
    decided_and_indexed(mine, user, "Something else entirely.", "Mine.")
    recall = examples_recall(
        queue=mine, query_text="Where is my card?", k=5, token_budget=10_000, pool=5
    )
    shown = [r.example.output_text for r in [*recall.examples, *recall.neighbours]]
    assert "Other queue's answer." not in shown


def test_roles_are_per_queue() -> None:
    person = UserFactory()
    curated, reviewed, watched, foreign = (
        QueueFactory(curators=[person]),
        QueueFactory(members=[person]),
        QueueFactory(viewers=[person]),
        QueueFactory(),
    )
    assert [role_in(person, q) for q in (curated, reviewed, watched, foreign)] == [
        "curator",
        "reviewer",
        "viewer",
        None,
    ]
    assert [can_curate(person, q) for q in (curated, reviewed, watched, foreign)] == [
        True,
        False,
        False,
        False,
    ]
    assert [can_review(person, q) for q in (curated, reviewed, watched, foreign)] == [
        True,
        True,
        False,
        False,
    ]


def test_the_migration_gives_each_membership_its_users_old_group_role() -> None:
    curator, reviewer, looker = UserFactory(), UserFactory(), UserFactory()
    Group.objects.get_or_create(name="curator")[0].user_set.add(curator)
    Group.objects.get_or_create(name="reviewer")[0].user_set.add(reviewer, curator)
    first, second = QueueFactory(), QueueFactory()
    for queue in (first, second):
        queue.members.add(curator, reviewer, looker, through_defaults={"role": "viewer"})
    roles_migration.roles_from_groups(apps, None)
    assert dict(Membership.objects.filter(queue=second).values_list("user", "role")) == {
        curator.pk: "curator",
        reviewer.pk: "reviewer",
        looker.pk: "viewer",
    }
    Group.objects.filter(name__in=["curator", "reviewer"]).delete()
    roles_migration.groups_from_roles(apps, None)  # and back
    assert set(Group.objects.get(name="curator").user_set.all()) == {curator}


def test_a_new_token_is_shown_through_the_session_never_a_cookie(queue: Any) -> None:
    admin = Client()
    admin.force_login(UserFactory(is_staff=True, is_superuser=True))
    response = admin.post(
        "/admin/ingest/integrationtoken/add/",
        {"queue": queue.pk, "name": "Zendesk", "scopes": ["items", "export"]},
    )
    assert response.status_code == 302
    record = IntegrationToken.objects.get()
    assert record.scopes == ["items", "export"]
    assert all(record.prefix not in morsel.value for morsel in response.cookies.values())
    shown = admin.get(response["Location"]).content.decode()
    assert record.prefix in shown  # the whole token, once, from the session


def test_opening_an_item_claims_nothing_and_the_pages_post_does(queue: Any, user: Any) -> None:
    """A link from another site (a GET) cannot claim work; the page posts the claim as it
    loads, with its CSRF token, and a GET to the claim route is refused."""
    item = ItemFactory(queue=queue)
    ready_generation(item, ["one", "two"])
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    page = client.get(f"/items/{item.pk}/").content.decode()
    assert not Claim.objects.exists()
    assert f'hx-post="/items/{item.pk}/claim/" hx-trigger="load, every' in page
    assert client.get(f"/items/{item.pk}/claim/").status_code == 405
    assert client.post(f"/items/{item.pk}/claim/").status_code == 403  # no CSRF token
    assert not Claim.objects.exists()
    token = client.cookies["csrftoken"].value
    taken = client.post(f"/items/{item.pk}/claim/", HTTP_X_CSRFTOKEN=token)
    assert taken.status_code == 200 and "This item is yours until" in taken.content.decode()
    assert Claim.objects.get().reviewer == user


def test_the_installs_key_goes_to_its_own_endpoint_only(settings: Any) -> None:
    """A queue pointed at someone's server (its api_base) is sent no key, or the key of the
    named endpoint at that address; never LLM_API_KEY. Through litellm's real HTTP path."""
    own, stranger = FixedLatencyLLM(latency_s=0).start(), FixedLatencyLLM(latency_s=0).start()
    try:
        settings.LLM_API_BASE, settings.LLM_API_KEY = own.api_base, "install-secret"
        settings.LLM_ENDPOINTS = {}
        ask = {"messages": [{"role": "user", "content": "Hi"}], "model": "openai/m", "params": {}}
        llm.complete(**ask)
        assert own.last_authorization == "Bearer install-secret"
        llm.complete(**ask, api_base=stranger.api_base)
        assert stranger.last_authorization == f"Bearer {llm.NO_KEY}"
        settings.LLM_ENDPOINTS = {
            "theirs": {"model": "openai/m", "api_base": stranger.api_base, "key": "their-own-key"}
        }
        llm.complete(**ask, api_base=stranger.api_base + "/")
        assert stranger.last_authorization == "Bearer their-own-key"
    finally:
        own.stop()
        stranger.stop()


def test_only_a_superuser_points_a_queue_at_one_of_the_installs_endpoints(
    queue: Any, settings: Any
) -> None:
    settings.LLM_ENDPOINTS = {
        "hosted": {"model": "openai/big", "api_base": "https://llm.example/v1", "key": "k"}
    }
    curator = UserFactory(is_staff=True)
    curator.user_permissions.add(*Permission.objects.filter(codename__endswith="_queue"))
    queue.members.add(curator, through_defaults={"role": "curator"})
    url = f"/admin/queues/queue/{queue.pk}/change/"
    client = Client()
    client.force_login(curator)
    page = client.get(url).content.decode()
    assert 'name="name"' in page  # the curator edits the queue…
    assert 'name="api_base"' not in page and 'name="model"' not in page  # …not where it calls
    assert "disabled" in page.split('name="endpoint"')[1].split(">")[0]
    assert endpoint_posted(curator, queue, "hosted") == ("", "")  # disabled: never taken

    superuser = UserFactory(is_staff=True, is_superuser=True)
    admin_page = Client()
    admin_page.force_login(superuser)
    page = admin_page.get(url).content.decode()
    assert 'name="api_base"' not in page  # a name from the list, never a typed address
    assert "hosted: openai/big at https://llm.example/v1" in page
    assert endpoint_posted(superuser, queue, "hosted") == ("openai/big", "https://llm.example/v1")
    # The install's own is stored empty: it follows LLM_MODEL and LLM_API_BASE.
    assert endpoint_posted(superuser, queue, "default") == ("", "")


def endpoint_posted(user: Any, queue: Any, endpoint: str) -> tuple[str, str]:
    """The queue's model and base URL after `user` saves its admin form with `endpoint`."""
    request = RequestFactory().post("/")
    request.user = user
    queue_admin = site._registry[Queue]
    form_class = queue_admin.get_form(request, queue, change=True)
    data = {
        key: json.dumps(value) if isinstance(value, list | dict) else value
        for key, value in model_to_dict(queue).items()
        if value is not None and key != "members"  # managed in the inline
    }
    form = form_class(data={**data, "endpoint": endpoint}, instance=queue)
    assert form.is_valid(), form.errors
    form.save()
    queue.refresh_from_db()
    return queue.model, queue.api_base


def test_named_endpoints_are_read_and_checked_at_start_up(monkeypatch: pytest.MonkeyPatch) -> None:
    from django.core.exceptions import ImproperlyConfigured

    from icrlhf.settings import llm_endpoints

    monkeypatch.setenv("HOSTED_KEY", "sk-hosted")
    listed = '{"hosted": {"model": "openai/big", "api_base": "https://llm.example/v1/", '
    listed += '"key_env": "HOSTED_KEY"}}'
    assert llm_endpoints(listed) == {
        "hosted": {"model": "openai/big", "api_base": "https://llm.example/v1", "key": "sk-hosted"}
    }
    assert llm_endpoints("") == {}
    for wrong, says in [
        ("{not json", "must be a JSON object"),
        ('["a"]', "must be a JSON object"),
        ('{"x": {"model": "m"}}', "needs a `model` and an `api_base`"),
        ('{"default": {"model": "m", "api_base": "http://h"}}', "the install's own"),
    ]:
        with pytest.raises(ImproperlyConfigured, match=says):
            llm_endpoints(wrong)
