"""Automation watches itself: the sequential test on its audits (review/guard.py), pure, then
through the product: audits decided by reviewers pause a queue's automation, the routing page
and the dashboard say so, the webhook hears it, and a curator resumes it."""

import math
import random
from typing import Any

import pytest
from django.test import Client

from icrlhf.generation.models import Candidate, Generation
from icrlhf.queues.models import Item
from icrlhf.review import automation, guard, tasks
from icrlhf.review.decisions import decision_record
from icrlhf.review.models import Automation, AutomationPause
from tests.factories import ItemFactory, QueueFactory, UserFactory, ready_generation


def first_pause(outcomes: list[bool], target: float) -> int | None:
    """After how many audits the test pauses (None: never)."""
    for count in range(1, len(outcomes) + 1):
        if guard.watch_of(target, outcomes[:count]).alarm:
            return count
    return None


def stream(rng: random.Random, precision: float, audits: int) -> list[bool]:
    return [rng.random() < precision for _ in range(audits)]


def test_false_alarms_stay_below_five_percent_however_long_it_watches() -> None:
    """At exactly the promised precision, 1,000 runs of 1,000 audits each."""
    target, threshold = 0.9, math.log(1 / guard.ALPHA)
    # The ratio's two steps, as the guard computes them (a running sum keeps this fast).
    kept, wrong = guard.log_ratio([True], target), guard.log_ratio([False], target)
    alarms = 0
    for seed in range(1000):
        rng, ratio = random.Random(seed), 0.0
        for _ in range(1000):
            ratio += kept if rng.random() < target else wrong
            if ratio >= threshold:
                alarms += 1
                break
    assert alarms / 1000 <= guard.ALPHA


def test_a_drop_of_the_tuned_size_is_caught_in_the_audits_it_promises() -> None:
    rng = random.Random(11)
    delays = [first_pause(stream(rng, 0.8, 2000), 0.9) for _ in range(300)]
    assert all(delay is not None for delay in delays)
    mean = sum(d for d in delays if d is not None) / len(delays)
    promised = guard.audits_to_detect(0.9, 0.8)
    assert abs(mean - promised) / promised < 0.15  # Wald's approximation, overshoot included
    assert first_pause(stream(rng, 0.99, 2000), 0.9) is None  # better than promised: never


@pytest.fixture
def automating(db: None) -> Any:
    curator, reviewer = UserFactory(), UserFactory()
    queue = QueueFactory(
        members=[reviewer],
        curators=[curator],
        auto_apply_threshold=0.9,
        webhook_url="https://receiver.example/hook",
    )
    return queue, reviewer, curator


def audit(queue: Any, reviewer: Any, *, kept: bool) -> None:
    """An item applied automatically, sampled for audit, then decided by a reviewer."""
    item = ItemFactory(queue=queue, status=Item.Status.READY)
    applied, other = ready_generation(
        item, ["the applied answer", "another answer"]
    ).candidates.order_by("position")
    Automation.objects.create(
        item=item,
        generation=applied.generation,
        candidate=applied,
        confidence=0.95,
        threshold=queue.auto_apply_threshold,
        audit=True,
        final_text=applied.text,
    )
    decision_record(
        item_id=item.pk,
        reviewer=reviewer,
        verdict="chosen",
        candidate_id=(applied if kept else other).pk,
    )


@pytest.mark.django_db
def test_a_stream_whose_precision_drops_pauses_automation_within_the_promise(
    automating: Any, monkeypatch: pytest.MonkeyPatch, django_capture_on_commit_callbacks: Any
) -> None:
    queue, reviewer, curator = automating
    sent: list[int] = []
    monkeypatch.setattr(tasks.pause_webhook, "delay", sent.append)  # a test double
    # 20 audits kept as applied, then the precision falls to a half.
    outcomes = [True] * 20 + [False, True] * 30
    expected = first_pause(outcomes, 0.9)
    assert expected is not None and expected > 20
    before_drop = guard.watch_of(0.9, outcomes[:20])
    drift = 0.5 * math.log(0.8 / 0.9) + 0.5 * math.log(0.2 / 0.1)
    promised = (math.log(1 / guard.ALPHA) - before_drop.log_ratio) / drift
    assert expected - 20 <= math.ceil(promised) + 1

    with django_capture_on_commit_callbacks(execute=True):
        for count, kept in enumerate(outcomes, start=1):
            audit(queue, reviewer, kept=kept)
            assert AutomationPause.objects.filter(queue=queue).exists() == (count >= expected)
    pause = AutomationPause.objects.get()
    assert (pause.audits, pause.agreed, pause.target) == (expected, sum(outcomes[:expected]), 0.9)
    assert pause.upper_bound < 0.9
    assert sent == [pause.pk]  # the webhook, once

    # Paused: a confident generation stays with the reviewers.
    item = ItemFactory(queue=queue, status=Item.Status.READY)
    generation = ready_generation(item, ["sure"])
    Candidate.objects.filter(generation=generation).update(confidence=0.99)
    Generation.objects.filter(pk=generation.pk).update(calibration=None)
    assert automation.generation_consider(generation_id=generation.pk) is None

    routing = Client()
    routing.force_login(reviewer)
    page = routing.get(f"/q/{queue.slug}/routing/").content.decode()
    assert "Automation is paused" in page and "Resume automation" not in page
    assert "Automation is paused" in routing.get(f"/q/{queue.slug}/dashboard/").content.decode()
    assert routing.post(f"/q/{queue.slug}/routing/resume-automation/").status_code == 403
    assert guard.pause_active(queue) is not None

    routing.force_login(curator)
    assert "Resume automation" in routing.get(f"/q/{queue.slug}/routing/").content.decode()
    resumed = routing.post(f"/q/{queue.slug}/routing/resume-automation/", follow=True)
    assert "Automation resumed" in resumed.content.decode()
    pause.refresh_from_db()
    assert pause.resumed_by == curator and guard.pause_active(queue) is None
    # Watched afresh from the resume.
    state = guard.watch(queue)
    assert state is not None and state.audits == 0
    assert "no audit decided yet at this threshold" in (
        routing.get(f"/q/{queue.slug}/routing/").content.decode()
    )


def test_a_threshold_of_one_is_tested_without_dividing_by_zero() -> None:
    state = guard.watch_of(1.0, [True] * 10 + [False])
    assert math.isfinite(state.log_ratio) and state.alarm  # one miss breaks "all right"
    assert math.isfinite(guard.watch_of(1.0, []).audits_to_detect)


@pytest.mark.django_db
def test_the_pause_webhook_says_what_the_audits_showed(
    automating: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    queue, _reviewer, _curator = automating
    pause = AutomationPause.objects.create(
        queue=queue, target=0.9, audits=25, agreed=16, log_ratio=3.1, upper_bound=0.8
    )
    posted: list[dict[str, Any]] = []
    monkeypatch.setattr(guard.webhooks, "post_signed", lambda **kwargs: posted.append(kwargs))
    guard.pause_webhook_send(pause_id=pause.pk)
    (call,) = posted
    assert call["event"] == "automation.paused" and call["url"] == queue.webhook_url
    assert call["payload"]["audits"] == 25 and call["payload"]["audits_kept"] == 16
    assert call["payload"]["precision_upper_bound"] == 0.8


@pytest.mark.django_db
def test_a_stranger_cannot_resume_another_queues_automation(automating: Any) -> None:
    queue, _reviewer, _curator = automating
    AutomationPause.objects.create(
        queue=queue, target=0.9, audits=25, agreed=16, log_ratio=3.1, upper_bound=0.8
    )
    stranger = Client()
    stranger.force_login(QueueFactory(curators=[UserFactory()]).membership_set.get().user)
    assert stranger.post(f"/q/{queue.slug}/routing/resume-automation/").status_code == 404
    assert guard.pause_active(queue) is not None
