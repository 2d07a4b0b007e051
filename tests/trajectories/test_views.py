"""The trajectory pages and admin: members of the queue only, per role; everything the agent
and the model wrote is escaped."""

from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from icrlhf.gateway.models import Call
from icrlhf.ingest.services import token_create
from icrlhf.memory.models import Example
from icrlhf.trajectories.models import Feedback, Trajectory
from icrlhf.trajectories.services import end_user_key
from tests.factories import (
    ItemFactory,
    QueueFactory,
    UserFactory,
    agent_step,
    member_add,
    ready_generation,
)

pytestmark = pytest.mark.django_db

HOSTILE = "<script>alert('x')</script>"


def _trajectory(queue: Any) -> Trajectory:
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "lookup_order", "arguments": '{"order_id": "' + HOSTILE + '"}'},
    }
    goal = [{"role": "user", "content": f"Where is order 4821? {HOSTILE}"}]
    first = agent_step(queue, goal, tool_calls=[call], tool_names=["lookup_order"])
    turns = [
        *goal,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": f"In transit {HOSTILE}"},
    ]
    agent_step(queue, turns, text=f"It is on its way. {HOSTILE}", tool_names=["lookup_order"])
    return first.trajectory


def test_a_viewer_sees_no_runs_what_end_users_wrote_is_for_reviewers() -> None:
    viewer = UserFactory()
    queue = QueueFactory(viewers=[viewer])
    trajectory = _trajectory(queue)
    client = Client()
    client.force_login(viewer)
    assert client.get(f"/q/{queue.slug}/trajectories/").status_code == 403
    assert client.get(f"/q/{queue.slug}/trajectories/{trajectory.pk}/").status_code == 403


@pytest.mark.parametrize("role", ["members", "curators"])
def test_reviewers_and_curators_see_the_queues_trajectories_timeline_escaped(role: str) -> None:
    person = UserFactory()
    queue = QueueFactory(**{role: [person]})
    trajectory = _trajectory(queue)
    client = Client()
    client.force_login(person)
    listing = client.get(f"/q/{queue.slug}/trajectories/")
    assert listing.status_code == 200
    assert f"/q/{queue.slug}/trajectories/{trajectory.pk}/" in listing.content.decode()
    page = client.get(f"/q/{queue.slug}/trajectories/{trajectory.pk}/").content.decode()
    assert "Step 1" in page and "Step 2" in page
    assert "lookup_order" in page and "It is on its way." in page
    assert HOSTILE not in page and "&lt;script&gt;" in page
    assert client.get(f"/q/{queue.slug}/trajectories/?outcome=failed").status_code == 200


def test_no_one_outside_the_queue_sees_its_trajectories_even_through_their_own_queue() -> None:
    outsider = UserFactory()
    queue, own = QueueFactory(), QueueFactory(members=[outsider])
    trajectory = _trajectory(queue)
    client = Client()
    client.force_login(outsider)
    assert client.get(f"/q/{queue.slug}/trajectories/").status_code == 404
    assert client.get(f"/q/{queue.slug}/trajectories/{trajectory.pk}/").status_code == 404
    # Another queue's trajectory through the outsider's own queue's address: not found.
    assert client.get(f"/q/{own.slug}/trajectories/{trajectory.pk}/").status_code == 404
    assert trajectory.goal not in client.get(f"/q/{own.slug}/trajectories/").content.decode()
    anonymous = Client().get(f"/q/{queue.slug}/trajectories/{trajectory.pk}/")
    assert anonymous.status_code == 302 and "/accounts/login/" in anonymous["Location"]


def test_the_admin_shows_a_staff_member_only_their_queues_trajectories() -> None:
    curator = UserFactory(is_staff=True)
    mine, theirs = QueueFactory(curators=[curator]), QueueFactory()
    own, foreign = _trajectory(mine), _trajectory(theirs)
    client = Client()
    client.force_login(curator)
    listing = client.get("/admin/trajectories/trajectory/").content.decode()
    assert f"/admin/trajectories/trajectory/{own.pk}/change/" in listing
    assert f"/admin/trajectories/trajectory/{foreign.pk}/change/" not in listing
    assert client.get(f"/admin/trajectories/trajectory/{foreign.pk}/change/").status_code == 302
    changed = client.post(
        f"/admin/trajectories/trajectory/{own.pk}/change/",
        {
            "outcome": "succeeded",
            "reward": "1",
            "steps-TOTAL_FORMS": "2",
            "steps-INITIAL_FORMS": "2",
            "steps-MIN_NUM_FORMS": "0",
            "steps-MAX_NUM_FORMS": "1000",
            "steps-0-id": own.steps.order_by("position")[0].pk,
            "steps-0-trajectory": own.pk,
            "steps-1-id": own.steps.order_by("position")[1].pk,
            "steps-1-trajectory": own.pk,
        },
    )
    assert changed.status_code == 302, changed.content.decode()[:2000]
    own.refresh_from_db()
    assert (own.outcome, own.reward) == ("succeeded", 1.0)


@pytest.mark.parametrize("role", ["viewer", "reviewer", "curator"])
def test_a_reviewer_sets_a_runs_outcome_as_feedback_under_their_name(role: str) -> None:
    person = UserFactory()
    queue = QueueFactory(reward_threshold=0.5)
    member_add(queue, person, role)
    trajectory = _trajectory(queue)
    client = Client()
    client.force_login(person)
    url = f"/q/{queue.slug}/trajectories/{trajectory.pk}/outcome"
    response = client.post(url, {"outcome": "failed"}, follow=True)
    if role == "viewer":
        assert response.status_code in (403, 404) and not Feedback.objects.exists()
        return
    assert b"Outcome set: failed." in response.content
    trajectory.refresh_from_db()
    assert trajectory.outcome == "failed"
    feedback = Feedback.objects.get()
    assert (feedback.success, feedback.token) == (False, None)
    assert feedback.comment == f"Outcome set by {person.username}."
    # The reward rule applies: the run's steps are stored as rejected.
    assert set(Example.objects.values_list("role", flat=True)) == {"rejected"}
    assert b"Choose Succeeded or Failed." in client.post(url, {"outcome": "x"}, follow=True).content
    # A change of mind, and back: each press counts.
    client.post(url, {"outcome": "succeeded"})
    client.post(url, {"outcome": "failed"})
    trajectory.refresh_from_db()
    assert trajectory.outcome == "failed" and Feedback.objects.count() == 3
    assert client.get(url).status_code == 405


def test_the_runs_list_shows_each_runs_key_and_owner() -> None:
    reviewer = UserFactory()
    queue = QueueFactory(members=[reviewer])
    token, _ = token_create(queue=queue, name="shop-bot")
    goal = [{"role": "user", "content": "Where is order 4821?"}]
    agent_step(queue, goal, key="order-4821", text="Shipped.", token=token, end_user="cust-7")
    agent_step(queue, [{"role": "user", "content": "Hello"}], text="Hi.", token=token)
    client = Client()
    client.force_login(reviewer)
    listing = client.get(f"/q/{queue.slug}/trajectories/").content.decode()
    assert '<th scope="col">Key</th><th scope="col">Owner</th>' in listing
    assert '<code class="wrap-anywhere">order-4821</code>' in listing
    assert "—</span>" in listing  # the run grouped by its conversation has no key
    assert listing.count("shop-bot") == 2
    # The end user by the keyed hash their runs are stored under: the id itself is kept nowhere.
    assert f"#{end_user_key('cust-7')[:10]}</code>" in listing
    assert "cust-7" not in listing


def test_an_empty_filter_says_none_match_and_how_many_runs_there_are() -> None:
    reviewer = UserFactory()
    queue, empty = QueueFactory(members=[reviewer]), QueueFactory(members=[reviewer])
    _trajectory(queue)
    agent_step(queue, [{"role": "user", "content": "Hello"}], text="Hi.")
    client = Client()
    client.force_login(reviewer)
    for query in ("?outcome=failed", "?approval=pending"):
        page = client.get(f"/q/{queue.slug}/trajectories/{query}").content.decode()
        assert "None match this filter (2 runs in all)." in page
        assert "No trajectories yet" not in page
    page = client.get(f"/q/{empty.slug}/trajectories/?outcome=failed").content.decode()
    assert "No trajectories yet" in page and "None match" not in page
    assert "No trajectories yet" in client.get(f"/q/{empty.slug}/trajectories/").content.decode()


def test_a_run_links_its_steps_to_their_review_items_and_calls_and_an_item_back_to_its_run() -> (
    None
):
    reviewer = UserFactory()
    queue = QueueFactory(members=[reviewer])
    item = ItemFactory(queue=queue, source="gateway", status="ready")
    ready_generation(item, ["Which address?", "It ships Monday."])
    first, second = (
        Call.objects.create(
            queue=queue,
            source="model",
            memory="empty",
            request_text=text,
            capture=capture,
            item=captured,
            created_at=timezone.now() - timedelta(minutes=minutes),
        )
        for text, capture, captured, minutes in (
            ("first call", "", None, 10),
            ("second call", "sampled", item, 9),
        )
    )
    goal = [{"role": "user", "content": "Where is order 4821?"}]
    later = [*goal, {"role": "assistant", "content": "Which address?"}]
    later.append({"role": "user", "content": "Berlin."})
    agent_step(queue, goal, key="run-1", text="Which address?", call_id=first.pk)
    run = agent_step(queue, later, key="run-1", text="It ships Monday.", call_id=second.pk)
    # 50 newer calls: the run's are on the call log's second page.
    Call.objects.bulk_create(
        Call(queue=queue, source="model", memory="empty", request_text=f"newer {n}")
        for n in range(50)
    )
    client = Client()
    client.force_login(reviewer)
    page = client.get(f"/q/{queue.slug}/trajectories/{run.trajectory.pk}/").content.decode()
    assert f'href="/items/{item.pk}/">Review item #{item.pk}</a>' in page
    assert page.count("/items/") == 1  # the first step's call was not captured
    for call in (first, second):
        assert f'href="/q/{queue.slug}/calls/?page=2#call-{call.pk}">Its call in the log' in page
    log = client.get(f"/q/{queue.slug}/calls/?page=2").content.decode()
    assert "first call" in log and "second call" in log

    shown = client.get(f"/items/{item.pk}/").content.decode()
    assert "Step 2 of 2 in an agent run" in shown
    assert f'href="/q/{queue.slug}/trajectories/{run.trajectory.pk}/#step-1"' in shown
