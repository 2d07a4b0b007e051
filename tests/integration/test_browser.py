"""The core flow in a real browser: Debian's headless Chromium driven by Playwright, against
the live Django server, with the real worker generating candidates."""

import os
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from icrlhf.memory.models import Example
from icrlhf.review.models import Decision
from tests.conftest import WorkerProcess, wait_for
from tests.factories import QueueFactory, UserFactory

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    # Playwright's sync API keeps an event loop on this thread while it runs; the tests' own
    # ORM calls are still synchronous, which Django would otherwise refuse. Only for this
    # module: the flag must not leak into other tests (or the processes they start).
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as playwright:
            chromium = playwright.chromium.launch(
                executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS
            )
            yield chromium
            chromium.close()
    finally:
        del os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"]


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context()
    page = context.new_page()
    page.set_default_timeout(30_000)
    yield page
    context.close()


def log_in(page: Page, base_url: str, username: str) -> None:
    page.goto(f"{base_url}/")
    expect(page).to_have_url(f"{base_url}/accounts/login/?next=/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill("pass-for-tests")
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("heading", name="Queues")).to_be_visible()


def create_item(page: Page, text: str, candidates: int) -> None:
    page.get_by_label("Prompt or ticket").fill(text)
    page.get_by_label("Candidates").fill(str(candidates))
    page.get_by_role("button", name="Generate candidates").click()
    expect(page.get_by_text(f"{candidates} of {candidates} ready")).to_be_visible()


def test_a_reviewer_edits_a_candidate_and_the_next_item_remembers_it(
    worker_process: WorkerProcess, live_server: Any, page: Page
) -> None:
    queue = QueueFactory(name="Support", n_candidates=3)
    reviewer = UserFactory()
    log_in(page, live_server.url, reviewer.username)
    page.get_by_role("link", name="Support").click()

    create_item(page, "My card has not arrived yet, where is it?", candidates=3)
    expect(page.get_by_role("button", name="Pick candidate 3")).to_be_visible()
    page.get_by_text("Edit candidate 2").click()
    editor = page.get_by_label("Your answer, from candidate 2")
    expect(editor).to_have_value(
        page.locator("article.candidate").nth(1).locator(".text-block").inner_text()
    )
    editor.fill("It was posted on Monday; allow 3 working days.")
    page.get_by_role("button", name="Save edited answer 2").click()
    expect(page.get_by_text("Saved: edited.")).to_be_visible()
    expect(page.get_by_role("button", name="Pick candidate 1")).to_have_count(0)

    decision = Decision.objects.get()
    assert (decision.verdict, decision.reviewer_id) == ("edited", reviewer.pk)
    wait_for(lambda: not Example.objects.exclude(index_state="indexed").exists(), what="indexing")

    page.get_by_role("link", name="← Support").click()
    create_item(page, "I still haven't received my card.", candidates=2)
    retrieved = page.get_by_role("table").filter(has_text="Similarity")
    expect(retrieved).to_contain_text("It was posted on Monday; allow 3 working days.")
    assert queue.items.count() == 2


def test_hostile_text_echoed_by_the_model_stays_inert(
    worker_process: WorkerProcess, live_server: Any, page: Page
) -> None:
    QueueFactory(name="Hostile", n_candidates=1)
    UserFactory(username="target")
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    log_in(page, live_server.url, "target")
    page.get_by_role("link", name="Hostile").click()

    payload = '<img src=x onerror="alert(1)"><script>alert(2)</script>'
    create_item(page, payload, candidates=1)  # the test endpoint echoes it in its answer
    candidate = page.locator("article.candidate .text-block")
    expect(candidate).to_contain_text('<img src=x onerror="alert(1)">')
    assert page.locator("article.candidate img").count() == 0
    assert dialogs == []
