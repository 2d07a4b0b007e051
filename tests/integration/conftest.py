import os
from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from tests.support.browser import CHROMIUM_ARGS, new_page


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    # Playwright's sync API keeps an event loop on this thread while it runs; the tests' own
    # ORM calls are still synchronous, which Django would otherwise refuse. Only for the
    # module using it: the flag must not leak into other tests (or the processes they start).
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
    page = new_page(browser)
    yield page
    page.context.close()
