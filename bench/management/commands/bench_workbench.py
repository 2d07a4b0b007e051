"""The reviewer's day: one reviewer makes N decisions in headless Chromium with the keyboard
only, while the real worker generates the items against an endpoint with a fixed latency.

A throw-away world with a real Celery worker and gunicorn; the items are created through the
services when the run starts, so the first ones are still arriving as the reviewer begins.
Every fifth decision is an edit (its label, e, a few words, Ctrl+Enter); the others a pick
(the label of the first candidate that has arrived, Enter).
Prints keystrokes per decision, the time from an item shown to its first pickable
candidate, from a submit to the next pickable item, and the page's height at 1366×900.

Before it, the step-review path: captured steps of a tool-calling agent (bench/captured_steps.py:
a goal, three lookups with long results, N tool-call candidates, all done), decided on the
step page as the reply path decides: the right action's number, Enter; every fifth an edit
(e, Tab to its note, End, a few words, Ctrl+Enter). Prints keystrokes per step decision and
the seconds from a step shown to its decision recorded (the server's answer to the submit),
beside the reply path's figures, and what the decisions recorded (the right action; the
edits with their words). It runs while nothing else is generating.

Then the triage path: Banking77 tickets in a triage queue whose proposals the real local
model writes (structured output). Knowing each ticket's true category, the reviewer picks a
proposal that has it (its number, Enter), else picks the first and corrects the category
(e, as few letters as bring it to the top of the matches, Enter, Ctrl+Enter). Prints the
share of valid proposals and keystrokes per triage."""

import contextlib
import json
import re
import statistics
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlparse

from django.conf import settings
from django.contrib.auth.models import User
from django.core.management.base import CommandError, CommandParser

from bench import captured_steps
from bench.world import WorldCommand, add_llm_options, llm_endpoint, percentile, world
from tests.support.fixed_latency_llm import FixedLatencyLLM

PASSWORD = "bench-reviewer-password"  # noqa: S105 (a throw-away world's user)
EDIT = " Thanks for your patience."


class Command(WorldCommand):
    help = "Measure a keyboard-only reviewer's day in a real browser (keys, waits, page height)."

    def add_options(self, parser: CommandParser) -> None:
        parser.add_argument("--decisions", type=int, default=50)
        parser.add_argument("--candidates", type=int, default=4, help="N per item.")
        parser.add_argument("--latency", type=float, default=2.0, help="LLM latency, seconds.")
        parser.add_argument(
            "--steps", type=int, default=20, help="Captured agent steps to decide (0: none)."
        )
        parser.add_argument(
            "--triage-tickets", type=int, default=10, help="Tickets on the triage path (0: none)."
        )
        add_llm_options(parser)  # the triage path's (the rest asks a fixed-latency LLM)

    def outside(self, options: dict[str, Any]) -> dict[str, Any]:
        llm = FixedLatencyLLM(latency_s=options["latency"]).start()
        try:
            with contextlib.ExitStack() as started:
                triage_llm = (
                    started.enter_context(llm_endpoint(options))
                    if options["triage_tickets"]
                    else {}
                )
                here = started.enter_context(
                    world(
                        "bench-workbench",
                        LLM_API_BASE=llm.api_base,
                        LLM_MODEL="openai/fixed-latency",
                        LOGIN_ATTEMPTS_PER_MINUTE="1000",
                        LOGIN_ATTEMPTS_PER_ADDRESS_PER_MINUTE="1000",
                    )
                )
                here.worker(concurrency=8)
                _web, base = here.web()
                steps: dict[str, Any] = {}
                if options["steps"]:  # first, so that nothing else is generating meanwhile
                    here.inside("bench_workbench", {**options, "phase": "steps"})
                    steps = drive_steps(base, options["steps"])
                    steps |= here.inside("bench_workbench", {**options, "phase": "steps-check"})
                seeded = here.inside(
                    "bench_workbench", {**options, "phase": "seed", "triage_llm": triage_llm}
                )
                result = drive(base, options) | steps
                if options["triage_tickets"]:
                    result |= drive_triage(base, seeded["gold"])
                return result
        finally:
            llm.stop()

    def measure(self, options: dict[str, Any]) -> dict[str, Any]:
        if options["phase"] == "steps":
            captured_steps.steps_seed(
                count=options["steps"], candidates=options["candidates"], reviewer=_reviewer()
            )
            return {}
        if options["phase"] == "steps-check":
            return captured_steps.steps_decided()
        seed(decisions=options["decisions"], candidates=options["candidates"])
        return {"gold": seed_triage(options["triage_tickets"], options["triage_llm"])}

    def report(self, result: dict[str, Any], options: dict[str, Any]) -> None:
        steps = bool(options["steps"])
        self.stdout.write(
            f"{result['decisions']} decisions, keyboard only, N={options['candidates']}, LLM "
            f"{options['latency']} s: {result['keystrokes_per_decision']:.1f} keystrokes a "
            f"decision ({result['command_keys_per_decision']:.1f} of them commands, the rest "
            "typed text)"
            + (
                f"; {result['step_decisions']} captured agent steps (N={options['candidates']} "
                f"tool calls): p50 {result['step_keystrokes_p50']:.0f} keystrokes a step "
                f"({result['step_keystrokes_per_decision']:.1f} on average; "
                f"{result['step_right_share']:.0%} decided for the right action, "
                f"{result['step_edits_saved']} saved edited)"
                if steps
                else ""
            )
        )
        self.stdout.write(
            f"Item shown → first candidate pickable: p50 {result['shown_to_pickable_p50_ms']:.0f}"
            f" ms, p95 {result['shown_to_pickable_p95_ms']:.0f} ms; submit → next item "
            f"pickable: p50 {result['submit_to_next_pickable_p50_ms']:.0f} ms, p95 "
            f"{result['submit_to_next_pickable_p95_ms']:.0f} ms"
            + (
                f"; agent step shown → decision recorded: p50 {result['step_seconds_p50']:.2f}"
                f" s, p95 {result['step_seconds_p95']:.2f} s"
                if steps
                else ""
            )
        )
        self.stdout.write(
            f"Review page at 1366×900: {result['page_height_p50_px']:.0f} px tall (p50), "
            f"Submit in view on load on {result['submit_in_view_share']:.0%} of items"
        )
        if options["triage_tickets"]:
            correct = result["triage_keystrokes_correct_p50"]
            self.stdout.write(
                f"Triage, {result['triage_tickets']} Banking77 tickets "
                f"({result['triage_not_generated']} failed to generate), N={TRIAGE_N} proposals "
                f"from the local model: {result['triage_valid_share']:.0%} valid; a proposal "
                f"had the true category on {result['triage_correct_share']:.0%} of tickets; "
                f"keystrokes per triage p50 {result['triage_keystrokes_p50']:.0f} (with a "
                f"correct proposal: {'–' if correct is None else f'{correct:.0f}'})"
            )


def _reviewer() -> User:
    """The bench's reviewer, made by whichever seed runs first."""
    reviewer = User.objects.filter(username="bench-reviewer").first()
    return reviewer or User.objects.create_user("bench-reviewer", password=PASSWORD)


def seed(*, decisions: int, candidates: int) -> None:
    from icrlhf.generation.services import item_create
    from icrlhf.playbook.models import Version
    from icrlhf.playbook.services import EntryDraft, version_create
    from icrlhf.queues.models import Queue

    reviewer = _reviewer()
    queue = Queue.objects.create(
        slug="bench",
        name="Bench",
        n_candidates=candidates,
        memory_candidates=0,
        reason_tags=["wrong facts", "too long"],
    )
    version_create(
        queue_id=queue.pk,
        drafts=[
            EntryDraft(section="Answers", text="Be correct."),
            EntryDraft(section="Answers", text="Be brief."),
        ],
        origin=Version.Origin.WRITTEN,
        author=None,
    )
    queue.members.add(reviewer)  # a reviewer of this queue
    for number in range(decisions):
        item_create(
            queue=queue,
            input_text=f"Request {number}: my card has not arrived, what should I do?",
            created_by=reviewer,
        )


TRIAGE_N = 3


def seed_triage(tickets: int, llm: dict[str, str]) -> dict[str, str]:
    """A triage queue on the benchmark's LLM with `tickets` Banking77 tickets; their ticket
    numbers (as the page shows them) and true categories."""
    from bench.learning import labelled_split
    from icrlhf.queues.models import Queue
    from icrlhf.triage.services import ticket_create

    if not tickets:
        return {}
    data = settings.SHARED_DATA_DIR / "banking77"
    _held_out, rows = labelled_split(data / "test.csv", seed=5, test=0, stream=tickets)
    queue = Queue.objects.create(
        slug="bench-triage",
        name="Bench triage",
        kind=Queue.Kind.TRIAGE,
        categories=json.loads((data / "categories.json").read_text()),
        system_prompt="You triage the support tickets of an online bank.",
        n_candidates=TRIAGE_N,
        memory_candidates=0,
        max_tokens=120,
        model=llm["LLM_MODEL"],
        api_base=llm["LLM_API_BASE"],
    )
    queue.members.add(User.objects.get(username="bench-reviewer"))
    gold = {}
    for number, row in enumerate(rows):
        item, _created = ticket_create(
            queue=queue,
            subject=row.text[:60],
            body=row.text,
            source="import",
            external_id=f"bench-{number}",
        )
        gold[str(item.pk)] = row.label
    return gold


def drive(base: str, options: dict[str, Any]) -> dict[str, Any]:
    from playwright.sync_api import sync_playwright

    keys = commands = 0
    shown_to_pickable: list[float] = []
    submit_to_pickable: list[float] = []
    heights: list[float] = []
    submit_in_view = 0

    with sync_playwright() as playwright:
        page = _browser_page(playwright, base, timeout_ms=120_000)
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
        page.context.browser.close()
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


_ITEM_PAGE = re.compile(r"/items/\d+/$")
# Each candidate's label and its text as shown (its tool calls' names and arguments).
_CANDIDATES = "els => els.map(e => [e.dataset.label, e.innerText])"


def drive_steps(base: str, count: int) -> dict[str, Any]:
    """Every captured step decided with the keyboard; per decision, its keystrokes and the
    seconds from the step shown (its page loaded) to the server's answer to the submit,
    which it gives once the decision is saved."""
    from playwright.sync_api import sync_playwright

    keys: list[int] = []
    seconds: list[float] = []
    with sync_playwright() as playwright:
        page = _browser_page(playwright, base, timeout_ms=60_000)
        page.goto(f"{base}/q/{captured_steps.SLUG}/review/")
        for number in range(count):
            # "Next item" has the focus once Chromium applies autofocus, which on a busy
            # machine may come after the load event: a key pressed before it goes nowhere,
            # so it is pressed again until a step opens.
            if not _item_shown(page, within_s=60):
                raise CommandError(f"Captured step {number + 1} did not open within 60 s.")
            page.wait_for_url(_ITEM_PAGE)
            page.wait_for_load_state()
            shown = time.monotonic()
            decided = page.url
            found = page.eval_on_selector_all("#decision-form article.candidate.done", _CANDIDATES)
            label = next(
                (label for label, text in found if captured_steps.RIGHT_NOTE in text),
                found[0][0],
            )
            with page.expect_response(
                lambda r, at=decided: r.request.method == "POST" and r.url == f"{at}decide/"
            ) as answer:
                keys.append(_decide_step(page, str(label), edit=number % 5 == 4))
            seconds.append(time.monotonic() - shown)
            # Saved: the server moves on. Refused: it shows the same step again.
            if answer.value.headers.get("location") in (None, urlparse(decided).path):
                raise CommandError(f"The decision on {decided} was not saved.")
            page.wait_for_url(_elsewhere(decided))
        page.context.browser.close()
    return {
        "step_decisions": count,
        "step_keystrokes_p50": statistics.median(keys),
        "step_keystrokes_per_decision": sum(keys) / count,
        "step_seconds_p50": percentile(seconds, 50),
        "step_seconds_p95": percentile(seconds, 95),
    }


def _decide_step(page: Any, label: str, *, edit: bool) -> int:
    """Picks the candidate and submits it, as it is or with words added to its note; the
    keystrokes it took."""
    page.keyboard.press(label)
    if not edit:
        page.keyboard.press("Enter")
        return 2
    page.keyboard.press("e")  # its editor, the tool's choice focused
    # Tab to the note: the fields come in the schema's order as the database keeps it
    # (PostgreSQL's jsonb orders an object's keys its own way), so count the tabs it takes.
    tabs = 0
    while not page.evaluate("document.activeElement.name || ''").endswith("__note"):
        if tabs == 10:
            raise CommandError("The note's field was not reached with the keyboard.")
        page.keyboard.press("Tab")
        tabs += 1
    page.keyboard.press("End")
    page.keyboard.type(captured_steps.NOTE_ADDED)
    page.keyboard.press("Control+Enter")
    return 4 + tabs + len(captured_steps.NOTE_ADDED)


# Whether an element lies within the window as the page opens.
_IN_VIEW = (
    "e => { const r = e.getBoundingClientRect();"
    " return r.top >= 0 && r.bottom <= window.innerHeight; }"
)


def _elsewhere(decided: str) -> Callable[[str], bool]:
    """Any page but the decided item's: where a saved decision leads."""
    return lambda url: url != decided


def _browser_page(playwright: Any, base: str, *, timeout_ms: int) -> Any:
    """Chromium at 1366×900, logged in as the bench's reviewer with the keyboard."""
    browser = playwright.chromium.launch(
        executable_path="/usr/bin/chromium", args=["--headless", "--no-sandbox"]
    )
    page = browser.new_context(viewport={"width": 1366, "height": 900}).new_page()
    page.set_default_timeout(timeout_ms)
    page.goto(f"{base}/accounts/login/")
    # Chromium applies autofocus at its next frame, which on a busy machine may come after
    # the load event: keys typed before it would go nowhere.
    page.wait_for_function("document.activeElement && document.activeElement.name === 'username'")
    page.keyboard.type("bench-reviewer")
    page.keyboard.press("Tab")
    page.keyboard.type(PASSWORD)
    page.keyboard.press("Enter")
    page.wait_for_url(f"{base}/")
    return page


# Each candidate's label and the category of its valid proposal ("" when invalid).
_PROPOSALS = (
    "els => els.map(e => [e.dataset.label,"
    " (e.querySelector('dl.triage-fields') || {dataset: {}}).dataset.category || ''])"
)
# The category box's first visible match.
_TOP_MATCH = (
    "() => { const o = [...document.querySelectorAll('#triage-category-list [role=option]')]"
    ".find(o => !o.hidden); return o ? o.dataset.value : ''; }"
)


def _item_shown(page: Any, *, within_s: float) -> bool:
    """Whether an item to review opens within the time: while the model is still writing,
    "Next item" (which has the focus) is asked again every second."""
    deadline = time.monotonic() + within_s
    while "/items/" not in page.url:
        if time.monotonic() > deadline:
            return False
        time.sleep(1)
        page.keyboard.press("Enter")
        page.wait_for_load_state()
    return True


def drive_triage(base: str, gold: dict[str, str]) -> dict[str, Any]:
    """Every ticket triaged with the keyboard, each to its true category."""
    from playwright.sync_api import sync_playwright

    keys_per_ticket: list[int] = []
    keys_when_correct: list[int] = []
    proposals = valid = 0
    with sync_playwright() as playwright:
        # The local model writes each ticket's proposals in turn: waits are long.
        page = _browser_page(playwright, base, timeout_ms=300_000)
        page.goto(f"{base}/q/bench-triage/review/")
        for _ticket in gold:
            if not _item_shown(page, within_s=300):
                break  # the rest failed to generate (a busy machine): counted apart
            page.wait_for_function(
                "n => document.querySelectorAll('#decision-form article.candidate.done,"
                " #decision-form article.candidate.failed').length >= n",
                arg=TRIAGE_N,
            )
            truth = gold[page.url.rstrip("/").rsplit("/", 1)[-1]]
            found = page.eval_on_selector_all("#decision-form article.candidate", _PROPOSALS)
            proposals += len(found)
            valid += sum(bool(category) for _label, category in found)
            right = next((label for label, category in found if category == truth), None)
            if right is not None:
                page.keyboard.press(str(right))
                page.keyboard.press("Enter")
                keys_when_correct.append(2)
                keys_per_ticket.append(2)
            else:
                page.keyboard.press(str(found[0][0]))
                page.keyboard.press("e")
                typed = 0
                for letter in truth.replace("_", " "):
                    page.keyboard.type(letter)
                    typed += 1
                    if page.evaluate(_TOP_MATCH) == truth:
                        break
                page.keyboard.press("Enter")  # takes the top match
                page.keyboard.press("Control+Enter")
                keys_per_ticket.append(4 + typed)
            decided = page.url
            page.wait_for_url(_elsewhere(decided))
            page.wait_for_load_state()
        page.context.browser.close()
    return {
        "triage_tickets": len(keys_per_ticket),
        "triage_not_generated": len(gold) - len(keys_per_ticket),
        "triage_valid_share": valid / proposals if proposals else 0.0,
        "triage_correct_share": len(keys_when_correct) / len(gold),
        "triage_keystrokes_p50": statistics.median(keys_per_ticket),
        "triage_keystrokes_correct_p50": (
            statistics.median(keys_when_correct) if keys_when_correct else None
        ),
    }
