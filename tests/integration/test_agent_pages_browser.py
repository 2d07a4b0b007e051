"""The pages a reviewer meets around agents, in a real browser (Debian's Chromium, Playwright,
the live server), at a laptop's size and a phone's, keyboard only where a decision is made:
a run awaiting approval is approved and its page says what memory kept; a filter that matches
no run says how many there are; a rule that would do nothing is refused with its sentence;
an item whose other candidates failed says so. Screenshots go to var/test/screenshots."""

from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, expect

from icrlhf.generation.models import Candidate
from icrlhf.ingest.services import token_create
from icrlhf.trajectories.feedback import feedback_record
from tests.factories import ItemFactory, QueueFactory, UserFactory, agent_step, ready_generation
from tests.support.browser import log_in, new_page

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

SCREENSHOTS = Path(__file__).resolve().parents[2] / "var" / "test" / "screenshots"
SIZES = {"desktop": (1366, 900, False), "phone": (390, 844, True)}


def opened(browser: Browser, size: str, base_url: str, username: str) -> Page:
    width, height, phone = SIZES[size]
    page = new_page(browser, width=width, height=height, phone=phone)
    log_in(page, base_url, username)
    return page


def fits(page: Page) -> None:
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= page.viewport_size["width"], width  # type: ignore[index]


@pytest.mark.parametrize("size", list(SIZES))
def test_a_run_awaiting_approval_is_approved_by_keyboard_and_says_what_memory_kept(
    live_server: Any, browser: Browser, size: str
) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    queue = QueueFactory(reward_threshold=0.5, rewards_need_approval=True)
    curator = UserFactory()
    queue.members.add(curator)
    record, _ = token_create(queue=queue, name="Shop agent")
    goal = [{"role": "user", "content": "My order 4821 arrived broken."}]
    run = agent_step(queue, goal, key="run-4821", text="Refunded.", token=record).trajectory
    feedback_record(
        queue=queue, token=record, call_id=None, trajectory_ref="run-4821", reward=0.9, success=True
    )
    page = opened(browser, size, live_server.url, curator.username)
    page.goto(f"{live_server.url}/q/{queue.slug}/trajectories/{run.pk}/")
    expect(page.get_by_text("Nothing yet: awaiting approval.", exact=False)).to_be_visible()
    approve = page.get_by_role("button", name="Approve into memory")
    approve.focus()
    with page.expect_navigation():
        page.keyboard.press("Enter")
    expect(page.get_by_text("Approved: 1 step stored as memory", exact=False)).to_be_visible()
    fits(page)
    page.screenshot(path=str(SCREENSHOTS / f"run-approved-{size}.png"), full_page=True)

    # A filter that matches none says how many runs there are.
    page.goto(f"{live_server.url}/q/{queue.slug}/trajectories/?outcome=failed")
    expect(page.get_by_text("None match this filter (1 run in all)", exact=False)).to_be_visible()
    fits(page)
    page.context.close()


@pytest.mark.parametrize("size", list(SIZES))
def test_a_rule_that_would_do_nothing_is_refused_with_its_sentence(
    live_server: Any, browser: Browser, size: str
) -> None:
    curator = UserFactory()
    queue = QueueFactory(curators=[curator])
    page = opened(browser, size, live_server.url, curator.username)
    page.goto(f"{live_server.url}/q/{queue.slug}/routing/")
    page.get_by_label("review the steps of runs rewarded below the bar").check()
    page.get_by_role("button", name="Save", exact=False).first.click()
    expect(page.get_by_text("Low-reward review needs a reward bar", exact=False)).to_be_visible()
    fits(page)
    page.screenshot(path=str(SCREENSHOTS / f"routing-refused-{size}.png"), full_page=True)
    queue.refresh_from_db()
    assert queue.capture_low_reward is False
    page.context.close()


@pytest.mark.parametrize("size", list(SIZES))
def test_when_the_other_candidates_failed_the_item_says_so_and_its_counts_are_true(
    live_server: Any, browser: Browser, size: str
) -> None:
    queue = QueueFactory()
    reviewer = UserFactory()
    queue.members.add(reviewer)
    item = ItemFactory(queue=queue, source="gateway", status="ready")
    generation = ready_generation(item, ["Served answer.", "", ""])
    Candidate.objects.filter(generation=generation, position=0).update(served=True)
    Candidate.objects.filter(generation=generation, position__gt=0).update(
        status=Candidate.Status.FAILED, error="The model is rate-limited"
    )
    page = opened(browser, size, live_server.url, reviewer.username)
    page.goto(f"{live_server.url}/items/{item.pk}/")
    page.wait_for_load_state()
    expect(page.get_by_text("1 of 3 ready, 2 failed")).to_be_visible()
    expect(page.locator("#single-candidate")).to_be_visible()
    failed_label = Candidate.objects.get(generation=generation, position=1).label
    page.keyboard.press(str(failed_label))
    expect(
        page.get_by_text(f"Candidate {failed_label} failed: retry it, or pick another.")
    ).to_be_visible()
    fits(page)
    page.screenshot(path=str(SCREENSHOTS / f"item-one-left-{size}.png"))
    page.context.close()
