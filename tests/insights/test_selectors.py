"""The dashboard's comparisons in words: what two arms' rates say for 0, some and enough
decided items, what to do next, and the test behind them one click away."""

import html
from typing import Any

import pytest

from icrlhf.insights.selectors import ENOUGH_PER_ARM, Arm, compare
from tests.factories import QueueFactory, UserFactory
from tests.gateway.test_routing_views import captured, client_of

NAMES = ("with memory", "without")


def arm(accepted: int, reviewed: int) -> Arm:
    return Arm(reviewed=reviewed, accepted=accepted)


def test_with_an_empty_arm_there_is_nothing_to_compare_yet() -> None:
    words = compare(arm(3, 3), arm(0, 0), effect="Memory's effect", names=NAMES)
    assert not words.telling and words.detail is None
    assert words.said == "Memory's effect: nothing to compare yet (3 with memory, 0 without)."
    assert words.next == (
        "decide 27 more with memory and 30 more without: 30 in each are enough to tell."
    )


def test_a_share_of_zero_says_to_set_it_instead() -> None:
    blocked = "set a holdout share in the routing rules."
    words = compare(arm(3, 3), arm(0, 0), effect="Memory's effect", names=NAMES, blocked=blocked)
    assert words.next == blocked


def test_a_few_items_are_not_enough_to_tell_and_the_p_value_is_only_a_detail() -> None:
    """One held-out item against three: p = 1.000 is no finding, and is not shown as one."""
    words = compare(arm(2, 3), arm(1, 1), effect="Memory's effect", names=NAMES)
    assert not words.telling
    assert words.said == (
        "Memory's effect: not enough decided items to tell yet (3 with memory, 1 without)."
    )
    assert words.next == (
        "decide 27 more with memory and 29 more without: 30 in each are enough to tell."
    )
    assert words.detail is not None and "p = 1.000" in words.detail
    assert "p =" not in words.said


def test_enough_items_with_no_significant_gap_say_it_could_be_chance() -> None:
    words = compare(
        arm(20, ENOUGH_PER_ARM), arm(18, ENOUGH_PER_ARM), effect="Memory's effect", names=NAMES
    )
    assert words.telling and words.next is None
    assert words.said == (
        "Memory's effect: no clear difference (+7 points could be chance; 30 with memory, "
        "30 without)."
    )


def test_a_significant_gap_is_said_even_on_few_items() -> None:
    """Fisher's exact test is valid on small counts: 6 of 6 against 0 of 6 is a finding."""
    words = compare(arm(6, 6), arm(0, 6), effect="Memory's effect", names=NAMES)
    assert words.telling and words.next is None
    assert words.said == (
        "Memory's effect: +100 points, more than chance would explain (6 with memory, 6 without)."
    )


@pytest.mark.django_db
def test_the_dashboard_says_memorys_effect_in_words(monkeypatch: pytest.MonkeyPatch) -> None:
    from icrlhf.review import decisions

    monkeypatch.setattr(decisions, "_memory_teach", lambda decision: None)
    reviewer = UserFactory()
    queue: Any = QueueFactory(members=[reviewer], holdout_percent=10)
    for accepted in (True, True, False):
        captured(queue, holdout=False, accepted=accepted, reviewer=reviewer)
    captured(queue, holdout=True, accepted=True, reviewer=reviewer)
    page = html.unescape(client_of(reviewer).get(f"/q/{queue.slug}/dashboard/").content.decode())
    holdout = page.split('aria-label="Holdout comparison"')[1]
    holdout = holdout.split('aria-label="Holdout chart"')[0]
    assert (
        "<strong>–</strong><span>Memory's effect: not enough decided items to tell yet "
        "(3 with memory, 1 without).</span>" in holdout
    )
    assert "Next: decide 27 more with memory and 29 more without" in holdout
    assert "p = " not in holdout.split("<details")[0]  # the test is one click away
    assert "p = 1.000" in holdout.split("<summary>The test behind this</summary>")[1]
