"""Security across the whole URL map: every route needs a login (or an API token) and the
right role; every form carries a CSRF token; no inline script; login and API rate limits."""

import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.apps import apps
from django.contrib.auth.models import Group, Permission
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver
from django.utils import timezone

from icrlhf.generation.models import Generation
from icrlhf.ingest.services import token_create
from icrlhf.memory.models import CurationEvent, Example
from icrlhf.queues.models import Queue
from icrlhf.review.decisions import decision_record
from icrlhf.review.models import Automation, Decision
from icrlhf.trajectories.services import RunOwner, run_hashes, step_record
from tests.factories import (
    ItemFactory,
    QueueFactory,
    UserFactory,
    playbook_write,
    ready_generation,
)

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]
# Routes anyone may open: the login page, and the admin's login, which redirects to it.
PUBLIC = {"accounts/login/", "admin/login/"}
LOGIN_PAGES = ("/accounts/login/", "/admin/login/")


def routes(patterns: list[Any] | None = None, prefix: str = "") -> Iterator[str]:
    """Every route of the URL map, as written (`q/<slug:slug>/`), regex routes included."""
    for pattern in patterns if patterns is not None else get_resolver().url_patterns:
        if isinstance(pattern, URLResolver):
            yield from routes(pattern.url_patterns, prefix + str(pattern.pattern))
        else:
            assert isinstance(pattern, URLPattern)
            yield prefix + str(pattern.pattern)


@pytest.fixture
def world(user: Any) -> dict[str, str]:
    """One of everything a route can name, in a queue `user` is NOT a member of."""
    queue = QueueFactory(slug="private-queue")
    item = ItemFactory(queue=queue)
    generation = ready_generation(item, ["first", "second"])
    candidate = generation.candidates.order_by("pk").first()
    assert candidate is not None
    member = UserFactory()
    queue.members.add(member)
    decision = decision_record(
        item_id=item.pk, reviewer=member, verdict="chosen", candidate_id=candidate.pk
    )
    automated = ItemFactory(queue=queue, status="automated")
    applied = ready_generation(automated, ["applied"]).candidates.get()
    automation = Automation.objects.create(
        item=automated,
        generation=applied.generation,
        candidate=applied,
        confidence=0.97,
        threshold=0.9,
        audit=False,
        final_text="applied",
    )
    goal = [{"role": "user", "content": "Where is order 4821?"}]
    trajectory = step_record(
        queue=queue,
        owner=RunOwner(token_id=None),
        key="run-1",
        messages=goal,
        hashes=run_hashes(messages=goal, answer_text="Monday.", tool_calls=[]),
        decision_point="Where is order 4821?",
        action_text="Monday.",
        tool_calls=[],
        tool_names=[],
        call_id=None,
        created_at=timezone.now(),
    ).trajectory
    playbook_write(queue, [("Tone", "Be brief.")])
    return {
        "trajectory_id": str(trajectory.pk),
        # The playbook's first entry and version; a proposal and a change (none need exist:
        # every such route refuses an outsider before it looks).
        "key": "1",
        "number": "1",
        "proposal_id": "1",
        "mutation_id": "1",
        "automation_id": str(automation.pk),
        "slug": queue.slug,
        "item_id": str(item.pk),
        "candidate_id": str(candidate.pk),
        "decision_id": str(decision.pk),
        "ticket_id": str(item.pk),
        "object_id": str(item.pk),
        "content_type_id": "1",
        "id": str(user.pk),
    }


def concrete(route: str, values: dict[str, str]) -> str:
    # The admin's two regex routes first: an app's index, and its catch-all.
    url = re.sub(r"\^\(\?P<app_label>[^)]*\)/\$", "auth/", route)
    url = url.replace("(?P<url>.*)$", "anything/")
    return "/" + re.sub(r"<(?:\w+:)?(\w+)>", lambda m: values[m.group(1)], url)


def test_the_route_list_is_complete() -> None:
    found = set(routes())
    assert {"q/<slug:slug>/dashboard/", "items/<int:item_id>/decide/", "api/v1/tickets"} <= found
    assert len(found) > 80  # the admin's routes included


def test_every_route_needs_a_login_or_a_token(world: dict[str, str]) -> None:
    anonymous = Client()
    for route in sorted(set(routes())):
        url = concrete(route, world)
        for method in ("get", "post"):
            response = getattr(anonymous, method)(url)
            where = f"{method.upper()} {url}"
            if route == "favicon.ico":  # public: it only points at the static icon
                assert response.status_code == 301, where
                assert response["Location"] == "/static/favicon.svg", where
            elif route in PUBLIC:
                assert response.status_code in {200, 302}, where
                if response.status_code == 302:
                    assert response["Location"].startswith("/accounts/login/"), where
            elif route.startswith("api/v1/") and route not in {
                "api/v1/openapi.json",
                "api/v1/docs",
                "api/v1/",  # leads to the docs
            }:
                assert response.status_code in {401, 404, 405}, where  # a token, not a login
            else:
                assert response.status_code == 302, where
                # The admin's own redirect lands on admin/login/, which sends to ours.
                assert response["Location"].startswith(LOGIN_PAGES), where


def test_a_user_outside_the_queue_reaches_none_of_its_objects(
    world: dict[str, str], logged_in: Client
) -> None:
    """`logged_in` is a reviewer who is not a member of the queue: every route that names the
    queue or one of its objects refuses, reading or writing, and the admin stays closed."""
    for route in sorted(set(routes())):
        named = re.findall(r"<(?:\w+:)?(\w+)>", route)
        objects = {"slug", "item_id", "candidate_id", "decision_id", "automation_id"}
        objects |= {"trajectory_id"}
        if not (set(named) & objects) and not (
            route.startswith("admin/") and route != "admin/login/"
        ):
            continue
        url = concrete(route, world)
        for method in ("get", "post"):
            response = getattr(logged_in, method)(url)
            where = f"{method.upper()} {url}"
            if route.startswith("admin/"):
                assert response.status_code == 302, where  # not staff: sent away, no page
                assert response["Location"].startswith(("/admin/", *LOGIN_PAGES)), where
            elif route.startswith("api/v1/"):
                # A login is no token: the API does not answer sessions at all.
                assert response.status_code in {401, 405}, where
            elif route == "decisions/<int:decision_id>/undo/" and method == "post":
                # Refused with a message ("not yours") and a redirect: nothing undone.
                assert response.status_code == 302, where
                assert Decision.objects.get(pk=world["decision_id"]).superseded_at is None
            else:
                assert response.status_code in {403, 404, 405}, where
    assert Automation.objects.get(pk=world["automation_id"]).undone_at is None


def admin_objects(world: dict[str, str]) -> dict[str, str]:
    """The admin's per-queue models (admin/<app>/<model>/), each with one object of the
    world's queue."""
    item_id = int(world["item_id"])
    queue = Queue.objects.get(slug=world["slug"])
    token, _secret = token_create(queue=queue, name="helpdesk")
    example = Example.objects.filter(decision__item_id=item_id).first()
    assert example is not None
    event = CurationEvent.objects.create(action="pin", example_id=example.pk, queue=queue)
    return {
        "queues/queue": str(queue.pk),
        "queues/item": world["item_id"],
        "generation/generation": str(Generation.objects.get(item_id=item_id).pk),
        "review/decision": world["decision_id"],
        "memory/example": str(example.pk),
        "memory/curationevent": str(event.pk),
        "ingest/integrationtoken": str(token.pk),
    }


@pytest.mark.parametrize("role", ["reviewer", "curator", "staff with every permission", "admin"])
def test_the_admin_per_object_pages_open_only_for_the_queues_a_user_belongs_to(
    world: dict[str, str], role: str
) -> None:
    """Every per-object admin route (change, history, delete, and any a model adds) of every
    per-queue model, read and written, by staff who belong to another queue: none opens,
    none changes anything. Only an admin (superuser) opens them all."""
    objects = admin_objects(world)
    staff = UserFactory(is_staff=role != "reviewer", is_superuser=role == "admin")
    if role == "staff with every permission":
        staff.user_permissions.add(*Permission.objects.all())
    # A member of another queue only, as a curator there unless a plain reviewer.
    QueueFactory().members.add(
        staff, through_defaults={"role": "reviewer" if role == "reviewer" else "curator"}
    )
    client = Client()
    client.force_login(staff)
    per_object = sorted(r for r in set(routes()) if "<path:object_id>" in r and r.count("/") > 3)
    covered = {route.split("/")[1] + "/" + route.split("/")[2] for route in per_object}
    assert set(objects) <= covered  # a new admin model must be added to admin_objects
    before = {model: _snapshot(model, pk) for model, pk in objects.items()}
    for route in per_object:
        model = route.split("/")[1] + "/" + route.split("/")[2]
        if model not in objects:
            continue  # accounts: people, not queue data (admins only, by permission)
        url = concrete(route, {"object_id": objects[model]})
        if role == "admin":  # reads only: a delete confirmed here would empty the world
            opened = client.get(url, follow=True)
            # The audit log and decisions are deleted by no one, not even an admin.
            assert opened.status_code in ({200, 403} if url.endswith("delete/") else {200}), url
            assert opened.request["PATH_INFO"] != "/admin/", url  # not "no such object"
            continue
        for method in ("get", "post"):
            response = getattr(client, method)(url, {"post": "yes"} if method == "post" else {})
            where = f"{role}: {method.upper()} {url}"
            assert response.status_code in {302, 403, 404}, where
            if response.status_code == 302:
                # Sent away: to the admin's index ("does not exist"), to log in, or from
                # the bare object URL on to its change page (itself refused, above or below).
                change_page = f"/admin/{model}/{objects[model]}/change/"
                assert response["Location"].split("?")[0] in {
                    "/admin/",
                    change_page,
                    *LOGIN_PAGES,
                }, where
    assert {model: _snapshot(model, pk) for model, pk in objects.items()} == before


def _snapshot(model: str, pk: str) -> object:
    app_label, model_name = model.split("/")
    model_class = apps.get_model(app_label, model_name)
    return list(model_class.objects.filter(pk=pk).values())


def test_curator_pages_refuse_a_plain_reviewer(logged_in: Client) -> None:
    assert logged_in.get("/export/").status_code == 403


def test_no_staff_member_but_a_superuser_manages_users_or_groups(queue: Any) -> None:
    """Staff with every permission (auth.change_user included) can neither tick superuser
    on themselves, nor join the admin group, nor open the user or group admin at all."""
    staff = UserFactory(is_staff=True)
    staff.user_permissions.add(*Permission.objects.all())
    queue.members.add(staff, through_defaults={"role": "curator"})
    client = Client()
    client.force_login(staff)
    admin_group = Group.objects.get_or_create(name="admin")[0]
    auth_routes = sorted(r for r in set(routes()) if r.startswith("admin/auth/"))
    assert auth_routes  # the user and group admins are in the URL map
    for route in auth_routes:
        url = concrete(route, {"object_id": str(staff.pk), "id": str(staff.pk)})
        assert client.get(url).status_code in {302, 403, 404}, url
    changed = client.post(
        f"/admin/auth/user/{staff.pk}/change/",
        {
            "username": staff.username,
            "is_active": "on",
            "is_staff": "on",
            "is_superuser": "on",
            "groups": [str(admin_group.pk)],
            "date_joined_0": "2026-01-01",
            "date_joined_1": "00:00:00",
        },
    )
    assert changed.status_code in {302, 403, 404}
    staff.refresh_from_db()
    assert not staff.is_superuser and not staff.groups.exists()
    assert "auth/user" not in client.get("/admin/").content.decode()

    superuser = Client()
    superuser.force_login(UserFactory(is_staff=True, is_superuser=True))
    assert superuser.get(f"/admin/auth/user/{staff.pk}/change/").status_code == 200


def test_every_form_that_posts_carries_a_csrf_token() -> None:
    for template in sorted((ROOT / "templates").rglob("*.html")):
        text = template.read_text()
        for form in re.findall(r"<form\b[^>]*>.*?</form>", text, flags=re.S | re.I):
            if re.search(r'method="post"', form, flags=re.I):
                assert "{% csrf_token %}" in form, f"{template}: {form[:120]}"


def test_a_post_without_the_csrf_token_is_refused(
    world: dict[str, str], queue: Any, user: Any
) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    response = client.post(f"/q/{queue.slug}/review/next/")
    assert response.status_code == 403


def test_no_template_has_an_inline_script() -> None:
    for template in (ROOT / "templates").rglob("*.html"):
        for tag in re.findall(r"<script\b[^>]*>", template.read_text(), flags=re.I):
            assert "src=" in tag, f"{template}: {tag}"
        assert not re.search(r"\son[a-z]+=", template.read_text()), template  # no onclick=…


def test_pages_send_a_content_security_policy_without_inline_scripts(
    logged_in: Client,
) -> None:
    policy = logged_in.get("/")["Content-Security-Policy"]
    directives = dict(part.strip().split(" ", 1) for part in policy.split(";") if part.strip())
    assert directives["script-src"] == "'self'"
    assert "unsafe-inline" not in directives["script-src"] and "unsafe-eval" not in policy
    assert directives["frame-ancestors"] == "'none'" and directives["object-src"] == "'none'"


def test_login_attempts_are_limited_per_user_name(settings: Any) -> None:
    settings.LOGIN_ATTEMPTS_PER_MINUTE = 3
    target = UserFactory(username="target")
    client = Client()
    for _ in range(3):
        wrong = client.post("/accounts/login/", {"username": "target", "password": "guess"})
        assert wrong.status_code == 200  # the form again, with its error
    right = client.post("/accounts/login/", {"username": "target", "password": "pass-for-tests"})
    assert right.status_code == 429 and right["Retry-After"] == "60"
    assert "Too many login attempts" in right.content.decode()
    assert "_auth_user_id" not in client.session
    other = UserFactory()
    elsewhere = Client(REMOTE_ADDR="10.0.0.2")
    ok = elsewhere.post(
        "/accounts/login/", {"username": other.username, "password": "pass-for-tests"}
    )
    assert ok.status_code == 302  # another person, another address: unaffected
    assert target.pk != other.pk


def test_api_calls_are_limited_per_token(settings: Any, api_token: str) -> None:
    settings.API_REQUESTS_PER_MINUTE = 3
    client = Client(HTTP_AUTHORIZATION=f"Bearer {api_token}")
    statuses = [client.get("/api/v1/tickets/999999").status_code for _ in range(4)]
    assert statuses == [404, 404, 404, 429]


def test_items_created_through_the_queue_page_are_limited_per_person(
    settings: Any, queue: Any, user: Any, logged_in: Client
) -> None:
    settings.ITEMS_PER_MINUTE_PER_USER = 2
    posts = [
        logged_in.post(f"/q/{queue.slug}/", {"input_text": f"Question {n}", "n_candidates": 2})
        for n in range(3)
    ]
    assert [p.status_code for p in posts] == [302, 302, 429]
    assert posts[2]["Retry-After"] == "30"
    assert (
        "You have created 2 items this minute, the most one person may; try again in 30 s. "
        "This one was not saved." in posts[2].content.decode()
    )
    assert queue.items.count() == 2
    colleague = UserFactory()
    queue.members.add(colleague)
    elsewhere = Client()
    elsewhere.force_login(colleague)
    fine = elsewhere.post(f"/q/{queue.slug}/", {"input_text": "Mine", "n_candidates": 2})
    assert fine.status_code == 302  # one person's limit, not the queue's


def test_tickets_created_through_the_api_are_limited_per_token_batches_whole(
    settings: Any, api_token: str, triage_queue: Any
) -> None:
    settings.TICKETS_PER_MINUTE_PER_TOKEN = 3
    client = Client(HTTP_AUTHORIZATION=f"Bearer {api_token}")

    def batch(*subjects: str) -> Any:
        tickets = [{"subject": s, "body": "text"} for s in subjects]
        return client.post("/api/v1/tickets/batch", {"tickets": tickets}, "application/json")

    assert batch("one", "two").status_code == 201
    refused = batch("three", "four")
    assert refused.status_code == 429 and refused["Retry-After"] == "30"
    assert refused.json()["detail"] == (
        "This token may create 3 tickets a minute; retry in 30 s. Nothing was saved."
    )
    single = {"subject": "three", "body": "text"}
    assert client.post("/api/v1/tickets", single, "application/json").status_code == 201
    assert client.post("/api/v1/tickets", single, "application/json").status_code == 429
    assert sorted(triage_queue.items.values_list("subject", flat=True)) == ["one", "three", "two"]


def test_guessing_api_tokens_is_limited(settings: Any, db: None) -> None:
    settings.API_REQUESTS_PER_MINUTE = 3
    statuses = [
        Client(HTTP_AUTHORIZATION=f"Bearer icrlhf_{uuid.uuid4().hex}")
        .get("/api/v1/tickets/1")
        .status_code
        for _ in range(4)
    ]
    assert statuses == [401, 401, 401, 429]


def test_a_refused_undo_never_redirects_to_another_site(
    world: dict[str, str], logged_in: Client
) -> None:
    response = logged_in.post(
        f"/decisions/{world['decision_id']}/undo/", {"back": "https://evil.example/"}
    )
    assert response.status_code == 302 and response["Location"] == "/"


def test_with_the_cache_down_logins_wait_and_api_calls_still_work(
    settings: Any, user: Any, api_token: str
) -> None:
    """The login limiter fails closed (no unlimited guessing while the cache is away); the
    API's limits fail open (a token already proves who calls)."""
    settings.CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": "redis://127.0.0.1:9/0",  # nothing listens there
        }
    }
    client = Client()
    login = client.post(
        "/accounts/login/", {"username": user.username, "password": "pass-for-tests"}
    )
    assert login.status_code == 503 and "unavailable for a moment" in login.content.decode()
    assert "_auth_user_id" not in client.session
    api = Client(HTTP_AUTHORIZATION=f"Bearer {api_token}").get("/api/v1/tickets/999999")
    assert api.status_code == 404


@pytest.mark.slow  # many calls in parallel threads: seconds on two cores
@pytest.mark.django_db(transaction=True)
def test_the_per_token_limit_holds_for_calls_in_parallel(settings: Any, api_token: str) -> None:
    """32 calls in flight at a time: exactly the limit is served, every other call is told
    when to retry."""
    from concurrent.futures import ThreadPoolExecutor

    settings.API_REQUESTS_PER_MINUTE = 20

    def call(_: int) -> Any:
        return Client(HTTP_AUTHORIZATION=f"Bearer {api_token}").get("/api/v1/tickets/999999")

    with ThreadPoolExecutor(max_workers=32) as pool:
        responses = list(pool.map(call, range(200)))
    statuses = [response.status_code for response in responses]
    assert statuses.count(404) == 20 and statuses.count(429) == 180
    refused = next(response for response in responses if response.status_code == 429)
    assert 1 <= int(refused["Retry-After"]) <= 60
    assert "retry in" in refused.json()["detail"]


@pytest.mark.parametrize("spelling", [" sec_user", "sec_user\t", "ｓｅｃ_user", "SEC_user"])
def test_the_login_limit_counts_every_spelling_django_reads_as_the_same_name(
    settings: Any, spelling: str
) -> None:
    settings.LOGIN_ATTEMPTS_PER_MINUTE = 3
    UserFactory(username="sec_user")
    guesser = Client(REMOTE_ADDR="10.0.1.1")
    for guess in ("sec_user", "SEC_USER", " sec_user"):
        guesser.post("/accounts/login/", {"username": guess, "password": "guess"})
    response = guesser.post(
        "/accounts/login/", {"username": spelling, "password": "pass-for-tests"}
    )
    assert response.status_code == 429
    assert "_auth_user_id" not in guesser.session


def test_guessing_a_name_from_one_address_does_not_lock_it_out_elsewhere(settings: Any) -> None:
    settings.LOGIN_ATTEMPTS_PER_MINUTE = 3
    victim = UserFactory(username="victim")
    attacker = Client(REMOTE_ADDR="203.0.113.9")
    for _ in range(5):
        attacker.post("/accounts/login/", {"username": "victim", "password": "guess"})
    assert (
        attacker.post(
            "/accounts/login/", {"username": "victim", "password": "pass-for-tests"}
        ).status_code
        == 429
    )
    at_home = Client(REMOTE_ADDR="198.51.100.7")
    response = at_home.post(
        "/accounts/login/", {"username": "victim", "password": "pass-for-tests"}
    )
    assert response.status_code == 302 and int(at_home.session["_auth_user_id"]) == victim.pk


def test_behind_trusted_proxies_the_client_address_is_the_one_they_saw(settings: Any) -> None:
    """X-Forwarded-For is read from the right, as many entries as the install has proxies:
    what the client wrote into the header itself never counts as its address."""
    from django.test import RequestFactory

    from icrlhf.accounts.ratelimit import client_ip

    request = RequestFactory().get(
        "/", REMOTE_ADDR="10.0.0.5", HTTP_X_FORWARDED_FOR="1.2.3.4, 198.51.100.7"
    )
    settings.TRUSTED_PROXY_COUNT = 0
    assert client_ip(request) == "10.0.0.5"
    settings.TRUSTED_PROXY_COUNT = 1
    assert client_ip(request) == "198.51.100.7"  # not the forged 1.2.3.4
    settings.TRUSTED_PROXY_COUNT = 2
    assert client_ip(request) == "1.2.3.4"
