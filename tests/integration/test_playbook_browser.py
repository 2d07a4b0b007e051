"""A curator keeps the playbook with the keyboard alone, at a desktop's and a phone's size:
adds a rule, decides a reflection's proposed changes, applies them, and restores an earlier
version. Screenshots of both pages at both sizes go to the test's folder."""

import json
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, expect

from icrlhf.playbook.models import Version
from icrlhf.reflection import services
from tests.factories import QueueFactory, UserFactory, playbook_write, ranked_decision
from tests.support.browser import log_in, new_page
from tests.support.llm_answer import LLMAnswer

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

SIZES = {"desktop": (1366, 900, False), "phone": (390, 844, True)}


def _press_through(page: Page, name: str) -> None:
    """Tab to the control named `name` and press Enter, as a keyboard user does."""
    control = page.get_by_role("button", name=name, exact=True)
    for _ in range(80):
        page.keyboard.press("Tab")
        if control.evaluate("element => element === document.activeElement"):
            page.keyboard.press("Enter")
            return
    raise AssertionError(f"{name!r} is not reachable with Tab")


@pytest.mark.parametrize("size", SIZES)
def test_a_curator_keeps_the_playbook_with_the_keyboard(
    live_server: Any, browser: Browser, llm_answer: LLMAnswer, tmp_path: Path, size: str
) -> None:
    width, height, phone = SIZES[size]
    curator = UserFactory()
    queue = QueueFactory(curators=[curator], members=[UserFactory()])
    playbook_write(queue, [("Tone", "Be brief.")])
    ranked_decision(queue, curator, pick_first=False)
    proposal = services.proposal_start(queue_id=queue.pk)
    llm_answer(
        json.dumps(
            {
                "mutations": [
                    {
                        "op": "edit",
                        "entry": "E1",
                        "section": "Tone",
                        "text": "Be brief and offer a call back.",
                        "cites": [1],
                        "why": "the call back was preferred",
                    }
                ]
            }
        )
    )
    services.proposal_reflect(proposal_id=proposal.pk)
    page = new_page(browser, width=width, height=height, phone=phone)
    log_in(page, live_server.url, curator.username)

    page.goto(f"{live_server.url}/q/{queue.slug}/playbook/")
    page.get_by_label("Section").last.focus()
    page.keyboard.type("Cards")
    page.keyboard.press("Tab")
    page.keyboard.type("Ask for the last four digits, never the whole number.")
    page.keyboard.press("Tab")
    page.keyboard.press("Enter")
    expect(page.get_by_text("Saved as version 2")).to_be_visible()
    assert page.evaluate("document.documentElement.scrollWidth") <= width
    page.screenshot(path=tmp_path / f"playbook-{size}.png", full_page=True)

    page.goto(f"{live_server.url}/q/{queue.slug}/playbook/proposals/")
    expect(page.get_by_text("Be brief and offer a call back.").first).to_be_visible()
    expect(page.locator(".edit-diff ins").first).to_be_visible()
    assert page.evaluate("document.documentElement.scrollWidth") <= width
    page.screenshot(path=tmp_path / f"proposals-{size}.png", full_page=True)
    _press_through(page, "Approve change 1")
    _press_through(page, "Apply the approved changes as a new version")
    expect(page.get_by_text("Applied as version 3 of the playbook.")).to_be_visible()
    expect(page.get_by_text("Be brief and offer a call back.").first).to_be_visible()

    _press_through(page, "Restore version 1")
    expect(page.get_by_text("Saved as version 4")).to_be_visible()
    latest = Version.objects.filter(queue=queue).first()
    assert latest is not None and [e.text for e in latest.entries.all()] == ["Be brief."]
    page.context.close()
