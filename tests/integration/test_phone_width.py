"""Every page of the app at a phone's width (390×844): the document is never wider than the
screen. Wide tables scroll inside their own box (`.table-scroll`), never the page.

The pages are listed by walking the URL conf, so a new page is measured without anyone
remembering to add it: every named route is opened with GET (those that answer 405 take POST
only, those that answer something other than HTML are not pages), its arguments filled from
the fixtures below; a route whose argument has no value here fails the test until one is
given. The admin adds its index and the product's models' lists, change and add pages.

PHONE_WIDTH_SCREENSHOTS=<folder> saves a full-page screenshot of each page there."""

import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib import admin
from django.test import RequestFactory
from django.urls import URLPattern, URLResolver, get_resolver, reverse
from django.utils import timezone
from playwright.sync_api import Browser, Page, expect

from icrlhf.gateway.models import Call
from icrlhf.help.docs import help_pages
from icrlhf.ingest.services import token_create
from icrlhf.memory import curation
from icrlhf.memory.models import Example, Retrieval
from icrlhf.queues.models import Item, Queue
from icrlhf.review.decisions import decision_record
from icrlhf.review.models import Automation, Decision
from icrlhf.trajectories.models import Trajectory
from icrlhf.trajectories.services import RunOwner, run_hashes, step_record
from tests.factories import ItemFactory, QueueFactory, UserFactory, ready_generation
from tests.support.browser import log_in, new_page

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

PHONE = (390, 844)

# What a page's content really holds, long enough to push a careless layout wider.
LONG_WORD = "delivery-times-and-tracking-your-new-card-in-the-settings-of-the-app"
LONG_LINK = "https://support.example.com/help/cards/delivery-times-and-tracking-your-new-card"
LONG_ANSWER = (
    "Thanks for reaching out! A new card usually arrives within five working days of the "
    f"order. You can follow its delivery in the app, or read {LONG_LINK} for the details. "
    "If it has not arrived after ten days, reply here and we will send another one."
)
CATEGORIES = [
    "card_arrival",
    "card_payment_wrong_exchange_rate",
    "exchange_rate",
    "lost_or_stolen_card",
    "Refund_not_showing_up",
    "transfer_not_received_by_recipient",
]


@dataclass
class World:
    """The rows the pages show, and the value of each URL argument to open them with."""

    admin: Any
    values: dict[str, list[Any]] = field(default_factory=dict)


def _general_queue(admin_user: Any) -> tuple[Queue, dict[str, list[Any]]]:
    queue = QueueFactory(
        name="Banking support, general questions",
        members=[admin_user],
        # A rule holds no link; a long word has to wrap all the same.
        playbook=[("Tone", "Friendly and short. Name the page " + LONG_WORD)],
        reason_tags=["wrong facts", "too long", "asks for card numbers", "impolite"],
    )
    decided = ItemFactory(queue=queue, input_text="When will my new card arrive?")
    generation = ready_generation(decided, [LONG_ANSWER, "Within a week.", "Ask the bank."])
    chosen = generation.candidates.order_by("position").first()
    decision = decision_record(
        item_id=decided.pk,
        reviewer=admin_user,
        verdict="chosen",
        candidate_id=chosen.pk if chosen else None,
        reason_tags=["too long"],
        comment="The first is complete and links to the help page.",
    )
    edited = ItemFactory(queue=queue, input_text="My card has not arrived after two weeks.")
    edited_generation = ready_generation(edited, [LONG_ANSWER, "Please wait."])
    decision_record(
        item_id=edited.pk,
        reviewer=admin_user,
        verdict="edited",
        candidate_id=edited_generation.candidates.order_by("position")[0].pk,
        final_text=LONG_ANSWER.replace("ten days", "two weeks"),
    )
    # An item waiting for review, whose prompt used the examples above.
    ready = ItemFactory(queue=queue, input_text="Where is my card? " + LONG_LINK)
    ready_generation_ = ready_generation(ready, [LONG_ANSWER, "It is on its way.", LONG_ANSWER])
    examples = list(Example.objects.filter(queue=queue).order_by("created_at"))
    for rank, example in enumerate(examples, start=1):
        Retrieval.objects.create(
            generation=ready_generation_, example=example, score=0.9 - rank / 10, rank=rank
        )
    curation.examples_status_set(
        ids=[examples[0].pk], status=Example.Status.PINNED, actor=admin_user, reason="always"
    )
    for number in range(3):
        Call.objects.create(
            queue=queue,
            source="model",
            memory="used",
            request_text=f"Question {number} about my card, see {LONG_LINK}",
            answer_text=LONG_ANSWER,
            model="openai/test-model",
            total_ms=1200,
            retrieval_ms=15,
            upstream_ms=1180,
            top_score=0.82,
            examples=[{"id": str(examples[0].pk), "score": 0.82}],
        )
    token_create(queue=queue, name="The help centre's chat widget")
    values = {
        "item_id": [ready.pk, decided.pk, edited.pk, _agent_step(queue).pk],
        "trajectory_id": [_trajectory(queue).pk],
        "decision_id": [decision.pk],
        "candidate_id": [chosen.pk if chosen else 0],
    }
    return queue, values


def _agent_step(queue: Queue) -> Item:
    """A captured step of an agent: its conversation with a tool call and a long result, and
    candidates that call tools with long arguments."""
    lookup = {"name": "lookup_order", "arguments": json.dumps({"order_id": "4821"})}
    item = ItemFactory(
        queue=queue,
        source=Item.Source.GATEWAY,
        input_text="My order 4821 arrived broken.\n\n" + LONG_LINK,
        conversation=[
            {"role": "system", "content": "You are a shop's support agent."},
            {"role": "user", "content": "My order 4821 arrived broken."},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "call_0", "type": "function", "function": lookup}],
            },
            {
                "role": "tool",
                "tool_call_id": "call_0",
                "content": json.dumps(
                    {"order_id": "4821", "condition": "damaged", "tracking": LONG_LINK}
                ),
            },
        ],
        call_options={
            "tools": [
                {"type": "function", "function": {"name": name, "parameters": {}}}
                for name in ("lookup_order", "refund", "escalate")
            ]
        },
    )
    generation = ready_generation(item, ["", "", "I am sorry: " + LONG_ANSWER])
    for candidate, (name, arguments) in zip(
        generation.candidates.order_by("position"),
        [("refund", {"order_id": "4821", "note": LONG_LINK}), ("escalate", {"order_id": "4821"})],
        strict=False,
    ):
        candidate.tool_calls = [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments)},
            }
        ]
        candidate.save(update_fields=["tool_calls"])
    return item


def _trajectory(queue: Queue) -> Trajectory:
    """An agent's run of two steps: a tool call with long arguments, then a long answer."""
    call = {
        "id": "call_0",
        "type": "function",
        "function": {"name": "lookup_order", "arguments": json.dumps({"note": LONG_LINK})},
    }
    goal = [{"role": "user", "content": "My order 4821 arrived broken. " + LONG_LINK}]
    turns = [
        *goal,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_0", "content": json.dumps({"url": LONG_LINK})},
    ]
    recorded = None
    for messages, text, calls in ((goal, "", [call]), (turns, LONG_ANSWER, [])):
        recorded = step_record(
            queue=queue,
            owner=RunOwner(token_id=None),
            key="",
            messages=messages,
            hashes=run_hashes(messages=messages, answer_text=text, tool_calls=calls),
            decision_point=str(messages[-1]["content"]),
            action_text=text,
            tool_calls=calls,
            tool_names=["lookup_order", "refund"],
            call_id=None,
            created_at=timezone.now(),
        )
    assert recorded is not None
    return recorded.trajectory


def _ticket(queue: Queue, subject: str, **fields: Any) -> Item:
    body = f"{subject}. I ordered it on the 3rd, the app says dispatched. {LONG_LINK}"
    return ItemFactory(
        queue=queue,
        input_text=f"{subject}\n\n{body}",
        subject=subject,
        body=body,
        customer="ana.maria.rodriguez-fernandez@example.com",
        channel="email",
        sla_due_at=timezone.now() + timedelta(hours=4),
        **fields,
    )


def _triage_answer(category: str) -> str:
    return json.dumps({"category": category, "priority": "high", "reply": LONG_ANSWER})


def _triage_queue(admin_user: Any) -> tuple[Queue, dict[str, list[Any]]]:
    queue = QueueFactory(
        name="Card tickets",
        kind="triage",
        n_candidates=2,
        members=[admin_user],
        categories=CATEGORIES,
        reason_tags=["wrong category", "wrong priority"],
    )
    waiting = _ticket(queue, "My new card has still not arrived after two weeks", priority="urgent")
    generation = ready_generation(
        waiting, [_triage_answer("card_arrival"), "Category: something else entirely"]
    )
    first, second = generation.candidates.order_by("position")
    first.fields = json.loads(_triage_answer("card_arrival"))
    first.save(update_fields=["fields"])
    second.parse_error = "The answer names no category."
    second.save(update_fields=["parse_error"])

    decided = _ticket(queue, "I was charged the wrong exchange rate on a payment abroad")
    decided_generation = ready_generation(decided, [_triage_answer("exchange_rate")])
    decided_candidate = decided_generation.candidates.get()
    decided_candidate.fields = json.loads(_triage_answer("exchange_rate"))
    decided_candidate.save(update_fields=["fields"])
    decision_record(
        item_id=decided.pk, reviewer=admin_user, verdict="chosen", candidate_id=decided_candidate.pk
    )

    automated = _ticket(queue, "Card lost on the train this morning", priority="high")
    automated_generation = ready_generation(automated, [_triage_answer("lost_or_stolen_card")])
    candidate = automated_generation.candidates.get()
    automation = Automation.objects.create(
        item=automated,
        generation=automated_generation,
        candidate=candidate,
        confidence=0.97,
        threshold=0.9,
        audit=False,
        final_text=LONG_ANSWER,
        final_fields=json.loads(_triage_answer("lost_or_stolen_card")),
    )
    Item.objects.filter(pk=automated.pk).update(status=Item.Status.AUTOMATED)
    values = {
        "item_id": [waiting.pk, decided.pk, automated.pk],
        "ticket_id": [waiting.pk],
        "automation_id": [automation.pk],
    }
    return queue, values


@pytest.fixture
def world() -> World:
    """An admin (and curator) who is a member of a general and a triage queue, both with
    items waiting and decided, examples, gateway calls and a token."""
    admin_user = UserFactory(username="ana.admin", is_staff=True, is_superuser=True)
    general, general_values = _general_queue(admin_user)
    triage, triage_values = _triage_queue(admin_user)
    values: dict[str, list[Any]] = {
        "slug": [general.slug, triage.slug],
        # The general queue's playbook entry, and its version; a proposal and a change (their
        # routes take POSTs only).
        "key": [1],
        "number": [1],
        "proposal_id": [1],
        "mutation_id": [1],
        "help:page slug": [page.slug for page in help_pages()],
    }
    for name, found in [*general_values.items(), *triage_values.items()]:
        values.setdefault(name, []).extend(found)
    assert Decision.objects.count() == 3
    return World(admin=admin_user, values=values)


@dataclass(frozen=True)
class Route:
    name: str  # namespaced, as reverse() takes it
    arguments: frozenset[str]


def routes(
    patterns: list[Any] | None = None, namespace: str = "", arguments: frozenset[str] = frozenset()
) -> Iterator[Route]:
    """Every named route of the URL conf, with the arguments its path takes. The admin's are
    listed apart (admin_pages): its URL conf holds every model's every view."""
    for pattern in get_resolver().url_patterns if patterns is None else patterns:
        found = arguments | set(getattr(pattern.pattern, "converters", {}))
        found |= set(pattern.pattern.regex.groupindex)
        if isinstance(pattern, URLResolver):
            if pattern.namespace == "admin":
                continue
            inner = f"{namespace}{pattern.namespace}:" if pattern.namespace else namespace
            yield from routes(pattern.url_patterns, inner, frozenset(found))
        elif isinstance(pattern, URLPattern) and pattern.name:
            yield Route(f"{namespace}{pattern.name}", frozenset(found))


def app_pages(values: dict[str, list[Any]]) -> list[tuple[str, str]]:
    """(what, URL) for every named route, once per value of its argument. A value is looked
    up as "<route name> <argument>" first (help:page's slug is no queue's), then by the
    argument's name."""
    pages = []
    for route in routes():
        found = {
            name: values.get(f"{route.name} {name}", values.get(name)) for name in route.arguments
        }
        missing = sorted(name for name, value in found.items() if value is None)
        assert not missing, (
            f"The route {route.name!r} takes {missing}: give the fixture `world` a value for "
            "it, so that its page is measured too."
        )
        if not route.arguments:
            pages.append((route.name, reverse(route.name)))
            continue
        names = sorted(found)  # several arguments are filled pairwise
        for combination in zip(*(found[name] or [] for name in names), strict=False):
            kwargs = dict(zip(names, combination, strict=True))
            pages.append((f"{route.name} {kwargs}", reverse(route.name, kwargs=kwargs)))
    return pages


def admin_pages(user: Any) -> list[tuple[str, str]]:
    """The admin's index, and each of the product's models' list, first change page and add
    page (where the user may add one)."""
    request = RequestFactory().get(reverse("admin:index"))
    request.user = user
    pages = [("admin:index", reverse("admin:index"))]
    for model, model_admin in admin.site._registry.items():
        if not model.__module__.startswith("icrlhf."):
            continue
        meta = model._meta
        base = f"admin:{meta.app_label}_{meta.model_name}"
        pages.append((f"{base}_changelist", reverse(f"{base}_changelist")))
        first = model._default_manager.order_by("pk").first()
        if first is not None:
            pages.append((f"{base}_change", reverse(f"{base}_change", args=[first.pk])))
        if model_admin.has_add_permission(request):
            pages.append((f"{base}_add", reverse(f"{base}_add")))
    return pages


# The elements that stick out, for the failure message: the innermost ones past the right
# edge that are not inside a box that scrolls.
_STICKING_OUT = """() => {
  const limit = window.innerWidth;
  const scrolls = (el) => {
    for (let p = el.parentElement; p; p = p.parentElement) {
      const x = getComputedStyle(p).overflowX;
      if ((x === 'auto' || x === 'scroll' || x === 'hidden') && p !== document.documentElement
          && p !== document.body) return true;
    }
    return false;
  };
  const out = [];
  for (const el of document.body.querySelectorAll('*')) {
    const box = el.getBoundingClientRect();
    if (box.right <= limit + 0.5 || box.width === 0 || scrolls(el)) continue;
    if ([...el.children].some((c) => c.getBoundingClientRect().right > limit + 0.5)) continue;
    const name = el.tagName.toLowerCase() + (el.id ? '#' + el.id : '')
      + [...el.classList].map((c) => '.' + c).join('');
    out.push(`${name} (right edge ${Math.round(box.right)} px)`);
  }
  return out.slice(0, 5);
}"""


def _shot_name(what: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", what.lower()).strip("-")


def _measure(page: Page, what: str, shots: Path | None) -> str | None:
    """None if the page fits; else what is too wide and by how much."""
    width = page.evaluate("document.documentElement.scrollWidth")
    viewport = page.evaluate("window.innerWidth")
    if viewport != PHONE[0]:  # no viewport tag: laid out for a desktop, then shrunk
        return f"{what} ({page.url}) is laid out {viewport} px wide: it needs a viewport tag"
    if shots is not None:
        page.screenshot(path=str(shots / f"{_shot_name(what)}.png"), full_page=True)
    if width <= viewport:
        return None
    culprits = ", ".join(page.evaluate(_STICKING_OUT))
    return f"{what} ({page.url}) is {width} px wide on a {viewport} px screen: {culprits}"


def test_every_page_fits_a_phone_screen(live_server: Any, browser: Browser, world: World) -> None:
    shots = None
    if folder := os.environ.get("PHONE_WIDTH_SCREENSHOTS"):
        shots = Path(folder)
        shots.mkdir(parents=True, exist_ok=True)
    page = new_page(browser, width=PHONE[0], height=PHONE[1], phone=True)
    # With screenshots asked for, each page on a laptop's screen too, to compare.
    desktop = new_page(browser, width=1366, height=900) if shots else None
    too_wide: list[str] = []
    measured: list[str] = []
    try:
        page.goto(f"{live_server.url}/accounts/login/")
        too_wide.append(_measure(page, "login (logged out)", shots) or "")
        log_in(page, live_server.url, world.admin.username)
        if desktop is not None:
            log_in(desktop, live_server.url, world.admin.username)
        for what, url in [*app_pages(world.values), *admin_pages(world.admin)]:
            # Asked first without the page (with its cookies): a browser refuses to show an
            # empty 405, and only HTML is a page.
            answer = page.request.get(f"{live_server.url}{url}")
            if answer.status == 405:
                continue  # takes POST only
            if not answer.headers.get("content-type", "").startswith("text/html"):
                continue  # JSON, an image
            assert answer.status == 200, f"{what} ({url}) answered {answer.status}"
            page.goto(f"{live_server.url}{url}")
            page.wait_for_load_state("networkidle")
            _open_what_opens(page)
            too_wide.append(_measure(page, what, shots) or "")
            measured.append(what)
            if desktop is not None and shots is not None:
                desktop.goto(f"{live_server.url}{url}")
                desktop.wait_for_load_state("networkidle")
                desktop.screenshot(
                    path=str(shots / f"desktop-{_shot_name(what)}.png"), full_page=True
                )
            if what.startswith("review:item "):
                too_wide.append(_help_dialog_too_wide(page, what) or "")
    finally:
        page.context.close()
        if desktop is not None:
            desktop.context.close()

    for expected in ["review:queue_list", "api:openapi-view", "export:page", "admin:index"]:
        assert expected in measured, f"{expected} was not measured: {measured}"
    assert len(measured) >= 30, measured
    problems = [problem for problem in too_wide if problem]
    assert not problems, "Wider than a phone:\n" + "\n".join(problems)


def _open_what_opens(page: Page) -> None:
    """What a reader opens counts too: the API docs' operations and schemas."""
    for control in page.locator(".opblock-summary-control, .model-box-control").all():
        control.click()
    if page.locator(".opblock-body").count():
        page.wait_for_load_state("networkidle")


def _help_dialog_too_wide(page: Page, what: str) -> str | None:
    """The item page's `?` dialog (the keys), opened: no wider than the screen either."""
    page.keyboard.press("?")
    dialog = page.locator("dialog[open]")
    if dialog.count() == 0:
        return f"{what}: `?` opened no dialog"
    box = dialog.first.bounding_box()
    page.keyboard.press("Escape")
    viewport = page.evaluate("window.innerWidth")
    if box is None or (box["x"] >= 0 and box["x"] + box["width"] <= viewport):
        return None
    return f"{what}: the `?` dialog spans {box['x']:.0f} to {box['x'] + box['width']:.0f} px"


def test_the_admins_examples_list_fits_a_laptop_screen(
    live_server: Any, browser: Browser, world: World
) -> None:
    """At 1366×900: every column in view without scrolling, the input readable (not a word a
    line), no weight for rejected examples, the weight box only beside "Reweight"."""
    page = new_page(browser, width=1366, height=900)
    try:
        log_in(page, live_server.url, world.admin.username)
        page.goto(f"{live_server.url}/admin/memory/example/")
        assert page.evaluate("document.documentElement.scrollWidth") <= 1366
        results = page.locator(".results")
        assert results.evaluate("box => box.scrollWidth <= box.clientWidth"), "the list scrolls"
        first_input = page.locator("th.field-short_input").first.bounding_box()
        assert first_input is not None and first_input["width"] >= 200, first_input
        rows = page.locator("#result_list tbody tr").all()
        assert len(rows) == Example.objects.count()
        for row in rows:
            role = row.locator("td.field-status_shown").inner_text().split(" · ")[0]
            weight = row.locator("td.field-weight_shown").inner_text()
            assert (weight == "–") == (role == "Rejected"), (role, weight)

        weight_box = page.get_by_label("Weight", exact=True)
        expect(weight_box).to_be_hidden()
        page.locator("select[name=action]").select_option("reweight")
        expect(weight_box).to_be_visible()
        page.locator("select[name=action]").select_option("pin")
        expect(weight_box).to_be_hidden()
    finally:
        page.context.close()


def test_the_ticket_list_fits_a_laptop_screen_with_whole_subjects(
    live_server: Any, browser: Browser, world: World
) -> None:
    """At 1366×900 the triage list needs no sideways scrolling, and a subject reads as a line
    or two, not a few words a line."""
    triage = Queue.objects.get(kind="triage")
    Item.objects.filter(queue=triage).update(category="card_payment_wrong_exchange_rate")
    page = new_page(browser, width=1366, height=900)
    try:
        log_in(page, live_server.url, world.admin.username)
        page.goto(f"{live_server.url}/q/{triage.slug}/?review=all")
        box = page.locator(".table-scroll")
        assert box.evaluate("box => box.scrollWidth <= box.clientWidth"), "the list scrolls"
        subject = page.locator("table.tickets td.subject").first.bounding_box()
        assert subject is not None and subject["width"] >= 280, subject
        if folder := os.environ.get("PHONE_WIDTH_SCREENSHOTS"):
            page.screenshot(path=f"{folder}/desktop-ticket-list.png", full_page=True)
    finally:
        page.context.close()
