"""The routing rules on the web: who sees and changes them, the audit of each change, the
queue page's summary, and the dashboard's holdout comparison from real decisions."""

import html
import re
from typing import Any

import pytest
from django.test import Client

from icrlhf.gateway.models import Call
from icrlhf.generation.models import Calibration, Candidate
from icrlhf.generation.ranking import FEATURES
from icrlhf.queues.models import Item, RoutingChange
from icrlhf.review.decisions import decision_record
from tests.factories import ItemFactory, QueueFactory, UserFactory, ready_generation

RULES = {
    "capture_percent": "25",
    "capture_below_similarity": "0.55",
    "holdout_percent": "10",
    "memory_answer_threshold": "",
    "auto_apply_threshold": "",
    "audit_percent": "10",
    "blind_percent": "0",
    "low_reward_captures_per_run": "3",
}


def client_of(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.django_db
def test_a_curator_changes_the_rules_and_each_change_is_audited() -> None:
    curator = UserFactory()
    queue = QueueFactory(curators=[curator], memory_answer_threshold=0.9)
    page = client_of(curator)
    response = page.post(f"/q/{queue.slug}/routing/", RULES)
    assert response.status_code == 302
    queue.refresh_from_db()
    assert (queue.capture_percent, queue.capture_below_similarity) == (25, 0.55)
    assert (queue.holdout_percent, queue.memory_answer_threshold) == (10, None)
    change = RoutingChange.objects.get()
    assert change.changed_by == curator
    assert change.changes == {
        "capture_percent": [0, 25],
        "capture_below_similarity": [None, 0.55],
        "holdout_percent": [0, 10],
        "memory_answer_threshold": [0.9, None],
    }
    shown = page.get(f"/q/{queue.slug}/routing/").content.decode()
    assert "capture share (%) 0 → 25" in shown and "answer from memory at 0.9 → off" in shown

    page.post(f"/q/{queue.slug}/routing/", RULES)  # the same values: nothing to audit
    assert RoutingChange.objects.count() == 1


@pytest.mark.django_db
def test_out_of_range_rules_are_refused_and_nothing_changes() -> None:
    curator = UserFactory()
    queue = QueueFactory(curators=[curator])
    response = client_of(curator).post(
        f"/q/{queue.slug}/routing/", {**RULES, "capture_percent": "150"}
    )
    assert response.status_code == 400
    assert "less than or equal to 100" in response.content.decode()
    queue.refresh_from_db()
    assert queue.capture_percent == 0 and not RoutingChange.objects.exists()


@pytest.mark.django_db
def test_a_curator_of_one_queue_is_only_a_reviewer_in_another() -> None:
    """Roles are per queue: curating one queue grants nothing in the next one, where the
    same person reviews (the routing page, the import and the export all refuse)."""
    person = UserFactory()
    QueueFactory(curators=[person])
    reviewed = QueueFactory(members=[person], auto_apply_threshold=None)
    page = client_of(person)
    response = page.post(f"/q/{reviewed.slug}/routing/", {**RULES, "auto_apply_threshold": "0.5"})
    assert response.status_code == 403
    reviewed.refresh_from_db()
    assert reviewed.auto_apply_threshold is None and not RoutingChange.objects.exists()
    assert page.get(f"/q/{reviewed.slug}/import/").status_code == 403
    export = page.get("/export/").content.decode()
    assert reviewed.slug not in export and reviewed.name not in export


@pytest.mark.django_db
def test_reviewers_see_the_rules_outsiders_nothing_admins_change_them() -> None:
    reviewer, outsider = UserFactory(), UserFactory()
    QueueFactory(curators=[outsider])  # a curator elsewhere is an outsider here
    queue = QueueFactory(members=[reviewer], capture_percent=5)
    ItemFactory(queue=queue, source=Item.Source.GATEWAY, status=Item.Status.READY)
    ItemFactory(queue=queue, source=Item.Source.GATEWAY, status=Item.Status.DECIDED)

    page = client_of(reviewer).get(f"/q/{queue.slug}/routing/")
    assert page.status_code == 200 and "curators change them" in page.content.decode()
    assert client_of(reviewer).post(f"/q/{queue.slug}/routing/", RULES).status_code == 403
    summary = client_of(reviewer).get(f"/q/{queue.slug}/").content.decode()
    assert "reviews 5% of calls" in summary and "1 captured call to review" in summary

    for path in (f"/q/{queue.slug}/routing/", f"/q/{queue.slug}/"):
        assert client_of(outsider).get(path).status_code == 404
    assert client_of(outsider).post(f"/q/{queue.slug}/routing/", RULES).status_code == 404
    queue.refresh_from_db()
    assert queue.capture_percent == 5

    admin = UserFactory(groups=["admin"])  # every queue, member or not
    assert client_of(admin).post(f"/q/{queue.slug}/routing/", RULES).status_code == 302
    queue.refresh_from_db()
    assert queue.capture_percent == 25
    assert RoutingChange.objects.get().changed_by == admin


def captured(queue: Any, *, holdout: bool, accepted: bool, reviewer: Any) -> None:
    """A captured call its reviewer decided: the served answer taken as is, or another."""
    item = ItemFactory(queue=queue, source=Item.Source.GATEWAY)
    generation = ready_generation(item, ["What the app got.", "Another answer."])
    Candidate.objects.filter(generation=generation, position=0).update(served=True)
    Call.objects.create(
        queue=queue,
        source=Call.Source.MODEL,
        memory=Call.Memory.USED,
        request_text=item.input_text,
        holdout=holdout,
        capture=Call.Capture.SAMPLED,
        item=item,
    )
    chosen = generation.candidates.get(position=0 if accepted else 1)
    decision_record(item_id=item.pk, reviewer=reviewer, verdict="chosen", candidate_id=chosen.pk)


@pytest.mark.django_db
def test_the_dashboard_compares_served_answers_with_memory_and_held_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from icrlhf.review import decisions

    monkeypatch.setattr(decisions, "_memory_teach", lambda decision: None)  # no store needed
    reviewer = UserFactory()
    queue = QueueFactory(members=[reviewer])
    for accepted in [True] * 18 + [False] * 2:
        captured(queue, holdout=False, accepted=accepted, reviewer=reviewer)
    for accepted in [True] * 5 + [False] * 15:
        captured(queue, holdout=True, accepted=accepted, reviewer=reviewer)

    page = html.unescape(client_of(reviewer).get(f"/q/{queue.slug}/dashboard/").content.decode())
    assert "<strong>90%</strong><span>accepted, served with memory (20 reviewed" in page
    assert "<strong>25%</strong><span>accepted, held out without memory (20 reviewed" in page
    assert "<strong>+65 pts</strong>" in page
    assert "Memory's effect: +65 points, more than chance would explain (20 with memory" in page
    assert "p = 0.000" in page.split("<summary>The test behind this</summary>")[1]
    assert "Served answers reviewers accepted as they were" in page  # the chart


@pytest.mark.django_db
def test_the_served_candidate_is_named_only_once_the_item_is_decided(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from icrlhf.review import decisions

    monkeypatch.setattr(decisions, "_memory_teach", lambda decision: None)
    reviewer = UserFactory()
    queue = QueueFactory(members=[reviewer])
    captured(queue, holdout=False, accepted=True, reviewer=reviewer)
    decided = Item.objects.get()
    waiting = ItemFactory(queue=queue, source=Item.Source.GATEWAY)
    generation = ready_generation(waiting, ["Served.", "Other."])
    Candidate.objects.filter(generation=generation, position=0).update(served=True)

    page = client_of(reviewer)
    before = page.get(f"/items/{waiting.pk}/").content.decode()
    assert "captured for review" in before and "served to the app" not in before
    after = page.get(f"/items/{decided.pk}/").content.decode()
    assert after.count("served to the app") == 1


@pytest.mark.django_db
def test_regenerating_a_captured_item_keeps_its_served_answer() -> None:
    from icrlhf.generation.services import generation_regenerate

    item = ItemFactory(queue=QueueFactory(), source=Item.Source.GATEWAY)
    generation = ready_generation(item, ["Served.", "Other."])
    Candidate.objects.filter(generation=generation, position=0).update(served=True, model="m")
    fresh = generation_regenerate(item_id=item.pk)
    assert fresh.pk != generation.pk
    kept = fresh.candidates.get(served=True)
    assert (kept.text, kept.model, kept.status) == ("Served.", "m", "done")
    assert fresh.candidates.filter(status="pending").count() == 1


@pytest.mark.django_db
def test_the_curator_picks_the_automation_threshold_from_the_queues_own_curve() -> None:
    curator = UserFactory()
    queue = QueueFactory(curators=[curator])
    page = client_of(curator)
    assert "No confidence yet" in page.get(f"/q/{queue.slug}/routing/").content.decode()
    Calibration.objects.create(
        queue=queue,
        features=list(FEATURES),
        coefficients=[0.0] * (len(FEATURES) + 1),
        top_coefficients=[0.0, 1.0],
        items=120,
        candidates=480,
        accepted_share=0.81,
        ece=0.031,
        curve=[
            {"threshold": 0.8, "precision": 0.93, "coverage": 0.71, "items": 85},
            {
                "threshold": 0.9,
                "precision": 0.97,
                "coverage": 0.58,
                "items": 70,
                "precision_low": 0.9118,
            },
        ],
        recommendations=[
            {
                "target": 0.9,
                "threshold": 0.884,
                "items": 74,
                "precision": 0.9595,
                "bound": 0.9013,
                "more_items_needed": None,
            },
            {
                "target": 0.95,
                "threshold": None,
                "items": 70,
                "precision": 0.9714,
                "bound": 0.9118,
                "more_items_needed": 41,
            },
            {
                "target": 0.99,
                "threshold": None,
                "items": 70,
                "precision": 0.9714,
                "bound": 0.9118,
                "more_items_needed": None,
            },
        ],
    )
    shown = page.get(f"/q/{queue.slug}/routing/").content.decode()
    assert "From this queue’s 120 decided items" in shown or "From this queue's 120" in shown
    assert '<th scope="row">0.90' in shown and "97%" in shown and "58%" in shown
    # The bound beside each precision ("–" for a curve kept before bounds were), and the
    # recommendation for each target, or how far the queue is from one.
    assert "<td>91.1%</td>" in shown and "<td>–</td>" in shown  # 0.9118, rounded down
    assert "set <strong>0.884</strong>" in shown and "at least 90.1% with 95% confidence" in shown
    assert "nothing can be promised yet" in shown and "about 41 more decided items" in shown
    assert "no threshold is that precise" in shown

    response = page.post(
        f"/q/{queue.slug}/routing/", {**RULES, "auto_apply_threshold": "0.9", "audit_percent": "5"}
    )
    assert response.status_code == 302
    queue.refresh_from_db()
    assert (queue.auto_apply_threshold, queue.audit_percent) == (0.9, 5)
    changes = RoutingChange.objects.get().changes
    assert (changes["auto_apply_threshold"], changes["audit_percent"]) == ([None, 0.9], [10, 5])
    assert "current" in page.get(f"/q/{queue.slug}/routing/").content.decode()
    history = page.get(f"/q/{queue.slug}/dashboard/").content.decode()
    assert f"{curator.username}: off → 0.9" in history
    low = page.post(f"/q/{queue.slug}/routing/", {**RULES, "auto_apply_threshold": "0.3"})
    assert low.status_code == 400 and "greater than or equal to 0.5" in low.content.decode()


@pytest.mark.django_db
def test_the_curator_sets_answering_from_memory_by_confidence_from_its_own_evidence() -> None:
    curator = UserFactory()
    reviewer = UserFactory()
    queue = QueueFactory(curators=[curator], members=[reviewer])
    page = client_of(curator)
    assert "No memory-only confidence yet" in page.get(f"/q/{queue.slug}/routing/").content.decode()
    Calibration.objects.create(
        queue=queue,
        features=list(FEATURES),
        coefficients=[0.0] * (len(FEATURES) + 1),
        top_coefficients=[0.0, 1.0],
        items=300,
        candidates=1200,
        accepted_share=0.8,
        memory_fit={
            "features": ["vote"],
            "coefficients": [0.0, 1.0],
            "platt": [0.0, 1.0],
            "isotonic": None,
            "items": 240,
            "accepted_share": 0.74,
            "ece": 0.027,
            "curve": [
                {
                    "threshold": 0.9,
                    "precision": 0.975,
                    "coverage": 0.5,
                    "items": 120,
                    "precision_low": 0.9372,
                }
            ],
            "recommendations": [
                {
                    "target": 0.9,
                    "threshold": 0.857,
                    "items": 131,
                    "precision": 0.9695,
                    "bound": 0.9304,
                    "more_items_needed": None,
                }
            ],
        },
    )
    shown = page.get(f"/q/{queue.slug}/routing/").content.decode()
    assert "240 decided items that had an answer from memory" in shown
    assert '<th scope="col">From memory</th>' in shown
    assert 'id="memory-recommendations"' in shown and "set <strong>0.857</strong>" in shown
    assert "<td>93.7%</td>" in shown  # the bound, rounded down

    rules = {**RULES, "memory_answer_confidence": "0.857"}
    assert client_of(reviewer).post(f"/q/{queue.slug}/routing/", rules).status_code == 403
    assert page.post(f"/q/{queue.slug}/routing/", rules).status_code == 302
    queue.refresh_from_db()
    assert queue.memory_answer_confidence == 0.857
    assert RoutingChange.objects.get().changes["memory_answer_confidence"] == [None, 0.857]
    shown = page.get(f"/q/{queue.slug}/routing/").content.decode()
    assert "confidence ≥ 0.857" in page.get(f"/q/{queue.slug}/").content.decode()
    assert 'id="memory-confidence" open' in shown  # in use: its evidence stays unfolded
    low = page.post(f"/q/{queue.slug}/routing/", {**rules, "memory_answer_confidence": "0.2"})
    assert low.status_code == 400
    stranger = client_of(UserFactory())
    assert stranger.get(f"/q/{queue.slug}/routing/").status_code == 404


def refused(response: Any) -> str:
    assert response.status_code == 400
    return html.unescape(response.content.decode())


@pytest.mark.django_db
def test_automation_with_no_confidence_fitted_is_refused_and_nothing_is_saved() -> None:
    curator = UserFactory()
    queue = QueueFactory(curators=[curator])
    typed = {**RULES, "auto_apply_threshold": "0.9", "capture_percent": "40"}
    page = refused(client_of(curator).post(f"/q/{queue.slug}/routing/", typed))
    assert (
        "Automation cannot run yet: there is no confidence to compare with a threshold. No "
        "decided items yet: 30 are needed before a threshold can be recommended." in page
    )
    # What was typed stays in the form; the rest of the page describes the rules as saved.
    assert 'name="auto_apply_threshold" value="0.9"' in page
    assert 'name="capture_percent" value="40"' in page
    assert "Watched by its audits" not in page
    queue.refresh_from_db()
    assert (queue.auto_apply_threshold, queue.capture_percent) == (None, 0)
    assert not RoutingChange.objects.exists()

    # Saved before this check existed (or in the admin), the rule does not block other edits.
    queue.auto_apply_threshold = 0.9
    queue.save()
    other = {**RULES, "auto_apply_threshold": "0.9", "capture_percent": "40"}
    assert client_of(curator).post(f"/q/{queue.slug}/routing/", other).status_code == 302
    queue.refresh_from_db()
    assert queue.capture_percent == 40


@pytest.mark.django_db
def test_answering_by_confidence_with_no_memory_confidence_is_refused() -> None:
    curator = UserFactory()
    queue = QueueFactory(curators=[curator])
    calibrated(queue)  # the ranking's confidence, but none for memory alone
    typed = {**RULES, "memory_answer_confidence": "0.9"}
    page = refused(client_of(curator).post(f"/q/{queue.slug}/routing/", typed))
    assert "Answering from memory by confidence cannot run yet" in page
    assert "No decided items with an answer from memory among their candidates yet" in page
    queue.refresh_from_db()
    assert queue.memory_answer_confidence is None and not RoutingChange.objects.exists()


@pytest.mark.django_db
def test_low_reward_review_without_a_reward_bar_is_refused() -> None:
    curator = UserFactory()
    queue = QueueFactory(curators=[curator])
    page = client_of(curator)
    typed = {**RULES, "capture_low_reward": "on", "reward_threshold": ""}
    shown = refused(page.post(f"/q/{queue.slug}/routing/", typed))
    assert "Low-reward review needs a reward bar to compare runs with" in shown
    assert re.search(r'<input type="checkbox" name="capture_low_reward"[^>]* checked>', shown)
    queue.refresh_from_db()
    assert not queue.capture_low_reward and not RoutingChange.objects.exists()

    saved = page.post(f"/q/{queue.slug}/routing/", {**typed, "reward_threshold": "0.5"})
    assert saved.status_code == 302
    queue.refresh_from_db()
    assert queue.capture_low_reward and queue.reward_threshold == 0.5


def calibrated(queue: Any, **fields: Any) -> Calibration:
    calibration: Calibration = Calibration.objects.create(
        queue=queue,
        features=list(FEATURES),
        coefficients=[0.0] * (len(FEATURES) + 1),
        top_coefficients=[0.0, 1.0],
        items=40,
        candidates=160,
        accepted_share=0.7,
        **fields,
    )
    return calibration


def decide_ranked(queue: Any, count: int) -> None:
    from django.utils import timezone

    from icrlhf.generation.models import Generation
    from tests.factories import DecisionFactory

    for _ in range(count):
        item = ItemFactory(queue=queue, status=Item.Status.DECIDED)
        generation = ready_generation(item, ["an answer"])
        Generation.objects.filter(pk=generation.pk).update(ranked_at=timezone.now())
        DecisionFactory(generation=generation, item=item)


@pytest.mark.django_db
def test_the_routing_page_says_how_far_the_queue_is_and_what_to_do_next() -> None:
    curator, reviewer = UserFactory(), UserFactory()
    queue = QueueFactory(curators=[curator], members=[reviewer], capture_percent=5)
    decide_ranked(queue, 12)
    page = html.unescape(client_of(curator).get(f"/q/{queue.slug}/routing/").content.decode())
    assert (
        "No confidence yet. 12 of 30 decided items needed before a threshold can be "
        "recommended: decide 18 more." in page
    )
    assert "once at least 30 items are decided" not in page
    assert "Next: decide 18 more items in this queue so a threshold can be recommended." in page
    assert "Next:" not in client_of(reviewer).get(f"/q/{queue.slug}/routing/").content.decode()


@pytest.mark.django_db
def test_the_audits_watch_is_said_in_words_and_the_test_is_one_click_away() -> None:
    curator = UserFactory()
    queue = QueueFactory(curators=[curator], auto_apply_threshold=0.9)
    calibrated(queue)
    page = client_of(curator).get(f"/q/{queue.slug}/routing/").content.decode()
    watch = page.split('id="automation-watch">')[1].split("</p>")[0]
    assert "no audit decided yet at this threshold" in watch
    assert "right less often than 90% of the time" in watch
    assert "sequential" not in watch
    method = page.split("<summary>How the audits are tested</summary>")[1].split("</details>")[0]
    assert "sequential test" in method and "under 5% false alarms" in method


@pytest.mark.django_db
def test_the_queue_page_never_says_no_calls_are_captured_while_a_rule_captures() -> None:
    reviewer = UserFactory()
    queue = QueueFactory(
        members=[reviewer], capture_low_reward=True, reward_threshold=0.5, auto_apply_threshold=0.9
    )
    ItemFactory(queue=queue, source=Item.Source.GATEWAY, status=Item.Status.READY)
    page = html.unescape(client_of(reviewer).get(f"/q/{queue.slug}/").content.decode())
    assert "captures no calls" not in page
    assert "reviews the steps of runs rewarded below 0.5 (at most 3 per run)" in page
    # No confidence is fitted: the threshold is saved but automation cannot run.
    assert "applies the first candidate" not in page
    assert "set at confidence ≥ 0.9 but cannot run yet" in page
    assert "1 captured call to review" in page


@pytest.mark.django_db
def test_automation_saved_before_any_confidence_is_said_not_to_run() -> None:
    """Saved before the form refused it: the page says it does nothing, and what to do."""
    curator = UserFactory()
    queue = QueueFactory(curators=[curator], auto_apply_threshold=0.9, capture_percent=5)
    decide_ranked(queue, 12)
    page = html.unescape(client_of(curator).get(f"/q/{queue.slug}/routing/").content.decode())
    assert "Automation is set but cannot run</strong> until a confidence is fitted" in page
    assert (
        "Next: decide 18 more items in this queue so a confidence can be fitted: automation is "
        "set but cannot run until then (or clear its threshold)." in page
    )
