"""The reviewer's day: one reviewer makes N decisions in headless Chromium with the keyboard
only, while the real worker generates the items against an endpoint with a fixed latency.

A throw-away world with a real Celery worker and gunicorn; the items are created through the
services when the run starts, so the first ones are still arriving as the reviewer begins.
Every fifth decision is an edit (its label, e, a few words, Ctrl+Enter); the others a pick
(the label of the first candidate that has arrived, Enter).
Prints keystrokes per decision, the time from an item shown to its first pickable
candidate, from a submit to the next pickable item, and the page's height at 1366×900."""

import statistics
import time
from collections.abc import Callable
from typing import Any

from django.core.management.base import CommandParser

from bench.world import WorldCommand, percentile, world
from tests.support.fixed_latency_llm import FixedLatencyLLM

PASSWORD = "bench-reviewer-password"  # noqa: S105 (a throw-away world's user)
EDIT = " Thanks for your patience."


class Command(WorldCommand):
    help = "Measure a keyboard-only reviewer's day in a real browser (keys, waits, page height)."

    def add_options(self, parser: CommandParser) -> None:
        parser.add_argument("--decisions", type=int, default=50)
        parser.add_argument("--candidates", type=int, default=4, help="N per item.")
        parser.add_argument("--latency", type=float, default=2.0, help="LLM latency, seconds.")

    def outside(self, options: dict[str, Any]) -> dict[str, Any]:
        llm = FixedLatencyLLM(latency_s=options["latency"]).start()
        try:
            with world(
                "bench-workbench",
                LLM_API_BASE=llm.api_base,
                LLM_MODEL="openai/fixed-latency",
                LOGIN_ATTEMPTS_PER_MINUTE="1000",
                LOGIN_ATTEMPTS_PER_ADDRESS_PER_MINUTE="1000",
            ) as here:
                here.worker(concurrency=8)
                _web, base = here.web()
                here.inside("bench_workbench", {**options, "phase": "seed"})
                return drive(base, options)
        finally:
            llm.stop()

    def measure(self, options: dict[str, Any]) -> dict[str, Any]:
        seed(decisions=options["decisions"], candidates=options["candidates"])
        return {}

    def report(self, result: dict[str, Any], options: dict[str, Any]) -> None:
        self.stdout.write(
            f"{result['decisions']} decisions, keyboard only, N={options['candidates']}, LLM "
            f"{options['latency']} s: {result['keystrokes_per_decision']:.1f} keystrokes a "
            f"decision ({result['command_keys_per_decision']:.1f} of them commands, the rest "
            "typed text)"
        )
        self.stdout.write(
            f"Item shown → first candidate pickable: p50 {result['shown_to_pickable_p50_ms']:.0f}"
            f" ms, p95 {result['shown_to_pickable_p95_ms']:.0f} ms; submit → next item "
            f"pickable: p50 {result['submit_to_next_pickable_p50_ms']:.0f} ms, p95 "
            f"{result['submit_to_next_pickable_p95_ms']:.0f} ms"
        )
        self.stdout.write(
            f"Review page at 1366×900: {result['page_height_p50_px']:.0f} px tall (p50), "
            f"Submit in view on load on {result['submit_in_view_share']:.0%} of items"
        )


def seed(*, decisions: int, candidates: int) -> None:
    from django.contrib.auth.models import User

    from icrlhf.generation.services import item_create
    from icrlhf.queues.models import Queue

    reviewer = User.objects.create_user("bench-reviewer", password=PASSWORD)
    queue = Queue.objects.create(
        slug="bench",
        name="Bench",
        n_candidates=candidates,
        memory_candidates=0,
        reason_tags=["wrong facts", "too long"],
        guidelines="## Guidelines\n\n- Be **correct**.\n- Be brief.",
    )
    queue.members.add(reviewer)  # a reviewer of this queue
    for number in range(decisions):
        item_create(
            queue=queue,
            input_text=f"Request {number}: my card has not arrived, what should I do?",
            created_by=reviewer,
        )


def drive(base: str, options: dict[str, Any]) -> dict[str, Any]:
    from playwright.sync_api import sync_playwright

    keys = commands = 0
    shown_to_pickable: list[float] = []
    submit_to_pickable: list[float] = []
    heights: list[float] = []
    submit_in_view = 0

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path="/usr/bin/chromium", args=["--headless", "--no-sandbox"]
        )
        page = browser.new_context(viewport={"width": 1366, "height": 900}).new_page()
        page.set_default_timeout(120_000)
        page.goto(f"{base}/accounts/login/")
        page.keyboard.type("bench-reviewer")
        page.keyboard.press("Tab")
        page.keyboard.type(PASSWORD)
        page.keyboard.press("Enter")
        page.wait_for_url(f"{base}/")
        page.goto(f"{base}/q/bench/review/")
        submitted = time.monotonic()
        for number in range(options["decisions"]):
            while "/items/" not in page.url:  # nothing pickable yet: ask again shortly
                time.sleep(0.3)
                page.keyboard.press("Enter")  # "Next item" has the focus
                page.wait_for_load_state()
            page.wait_for_selector("input[name=choice][value^=c]", state="attached")
            shown_to_pickable.append(page.evaluate("performance.now()"))
            submit_to_pickable.append((time.monotonic() - submitted) * 1000)
            page.wait_for_load_state()
            heights.append(page.evaluate("document.documentElement.scrollHeight"))
            submit = page.get_by_role("button", name="Submit decision")
            submit_in_view += bool(submit.evaluate(_IN_VIEW))
            # The first candidate that has arrived (others may still be generating).
            label = page.locator("article.candidate.done").first.get_attribute("data-label")
            if number % 5 == 4:
                page.keyboard.press(str(label))
                page.keyboard.press("e")
                page.keyboard.press("End")
                page.keyboard.type(EDIT)
                page.keyboard.press("Control+Enter")
                commands += 4
                keys += 4 + len(EDIT)
            else:
                page.keyboard.press(str(label))
                page.keyboard.press("Enter")
                commands += 2
                keys += 2
            submitted = time.monotonic()
            page.wait_for_url(_elsewhere(page.url))
            page.wait_for_load_state()
        browser.close()
    count = options["decisions"]
    return {
        "decisions": count,
        "keystrokes_per_decision": keys / count,
        "command_keys_per_decision": commands / count,
        "shown_to_pickable_p50_ms": percentile(shown_to_pickable, 50),
        "shown_to_pickable_p95_ms": percentile(shown_to_pickable, 95),
        "submit_to_next_pickable_p50_ms": percentile(submit_to_pickable, 50),
        "submit_to_next_pickable_p95_ms": percentile(submit_to_pickable, 95),
        "page_height_p50_px": statistics.median(heights),
        "page_height_max_px": max(heights),
        "submit_in_view_share": submit_in_view / count,
    }


# Whether an element lies within the window as the page opens.
_IN_VIEW = (
    "e => { const r = e.getBoundingClientRect();"
    " return r.top >= 0 && r.bottom <= window.innerHeight; }"
)


def _elsewhere(decided: str) -> Callable[[str], bool]:
    """Any page but the decided item's: where a saved decision leads."""
    return lambda url: url != decided
