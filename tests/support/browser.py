"""Driving Debian's headless Chromium with Playwright (never `playwright install`: it downloads
a browser of its own). The fixtures are in tests/integration/conftest.py."""

from typing import Any

from playwright.sync_api import Browser, Page, expect

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def new_page(
    browser: Browser, *, width: int | None = None, height: int | None = None, phone: bool = False
) -> Page:
    """A page in a context of its own (its own cookies), at the given viewport if any. A phone
    honours the page's viewport tag as phones do: without one, a page is laid out 980 px wide
    and shrunk to the screen."""
    options: dict[str, Any] = {}
    if width and height:
        options["viewport"] = {"width": width, "height": height}
    if phone:
        options.update(is_mobile=True, has_touch=True)
    page = browser.new_context(**options).new_page()
    page.set_default_timeout(20_000)
    return page


def log_in(page: Page, base_url: str, username: str) -> None:
    page.goto(f"{base_url}/")
    expect(page).to_have_url(f"{base_url}/accounts/login/?next=/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill("pass-for-tests")
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("heading", name="Queues")).to_be_visible()
