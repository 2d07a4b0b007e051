"""The review workbench in a real browser: Debian's headless Chromium driven by Playwright,
against the live Django server. One test also runs the real worker end to end."""

import json
from typing import Any

import pytest
from django.db.models import F
from django.utils import timezone
from playwright.sync_api import Browser, Page, expect

from icrlhf.generation import pipeline
from icrlhf.generation.models import Candidate, Generation
from icrlhf.memory.models import Example
from icrlhf.queues.models import Item
from icrlhf.review import decisions as review_decisions
from icrlhf.review.decisions import decision_record
from icrlhf.review.models import Claim, Decision
from icrlhf.triage.services import ticket_create
from tests.factories import (
    CandidateFactory,
    GenerationFactory,
    ItemFactory,
    QueueFactory,
    UserFactory,
    ready_generation,
)
from tests.support.browser import log_in, new_page
from tests.support.processes import WorkerProcess
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def start_reviewing(page: Page, base_url: str, queue: Any) -> None:
    page.goto(f"{base_url}/q/{queue.slug}/review/")
    page.get_by_role("button", name="Next item").click()
    page.wait_for_url("**/items/*/")
    page.wait_for_load_state()  # the keyboard script is deferred: wait until it runs


def ready_items(queue: Any, count: int, texts: list[str] | None = None) -> list[Item]:
    items = []
    for number in range(count):
        item = ItemFactory(queue=queue, input_text=f"Question {number}?")
        ready_generation(item, texts or [f"Answer A{number}", f"Answer B{number}"])
        items.append(item)
    return items


@pytest.fixture
def reviewer() -> Any:
    return UserFactory()


def test_pick_by_key_submit_then_undo(live_server: Any, page: Page, reviewer: Any) -> None:
    queue = QueueFactory(members=[reviewer])
    first, second = ready_items(queue, 2)
    log_in(page, live_server.url, reviewer.username)
    start_reviewing(page, live_server.url, queue)
    expect(page.get_by_role("heading", name=f"Item {first.pk}")).to_be_visible()

    page.keyboard.press("2")
    expect(page.get_by_label("Pick candidate 2")).to_be_checked()
    page.keyboard.press("Enter")
    expect(page.get_by_role("heading", name=f"Item {second.pk}")).to_be_visible()
    decision = Decision.objects.get()
    assert decision.verdict == "chosen" and decision.chosen_candidate.label == 2

    expect(page.get_by_text(f"Saved item {first.pk}: chosen.")).to_be_visible()
    page.wait_for_load_state()
    page.keyboard.press("u")
    expect(page.get_by_text(f"Undone: item {first.pk}")).to_be_visible()
    decision.refresh_from_db()
    assert decision.superseded_at is not None
    assert Item.objects.get(pk=first.pk).status == Item.Status.READY


def test_edit_and_submit_with_the_keyboard(live_server: Any, page: Page, reviewer: Any) -> None:
    queue = QueueFactory(members=[reviewer])
    (item,) = ready_items(queue, 1, ["The card ships in five days."])
    log_in(page, live_server.url, reviewer.username)
    start_reviewing(page, live_server.url, queue)

    page.keyboard.press("1")
    page.keyboard.press("e")
    editor = page.get_by_label("Your answer, from candidate 1")
    expect(editor).to_be_focused()
    expect(editor).to_have_value("The card ships in five days.")
    editor.fill("The card ships in two days.")
    expect(page.locator(".diff ins")).to_have_text("two")
    expect(page.locator(".diff del")).to_have_text("five")
    page.keyboard.press("Control+Enter")
    expect(page.get_by_text(f"Saved item {item.pk}: edited.")).to_be_visible()
    decision = Decision.objects.get()
    assert (decision.verdict, decision.final_text) == ("edited", "The card ships in two days.")


def test_none_acceptable_and_skip(live_server: Any, page: Page, reviewer: Any) -> None:
    queue = QueueFactory(members=[reviewer], reason_tags=["wrong facts", "too long"])
    first, second = ready_items(queue, 2)
    log_in(page, live_server.url, reviewer.username)
    start_reviewing(page, live_server.url, queue)

    page.keyboard.press("x")
    page.get_by_label("wrong facts").check()
    page.get_by_label("Comment").fill("Both answers invent a fee.")
    page.keyboard.press("Control+Enter")
    expect(page.get_by_role("heading", name=f"Item {second.pk}")).to_be_visible()
    decision = Decision.objects.get(item=first)
    assert decision.verdict == "none_acceptable"
    assert (decision.reason_tags, decision.comment) == (
        ["wrong facts"],
        "Both answers invent a fee.",
    )

    page.wait_for_load_state()
    page.keyboard.press("s")
    # The only item left, skipped: it comes back rather than "nothing left".
    expect(page.get_by_role("heading", name=f"Item {second.pk}")).to_be_visible()
    expect(page.get_by_text("Nothing left to review")).to_have_count(0)
    page.goto(f"{live_server.url}/q/{queue.slug}/review/")
    expect(page.get_by_role("heading", name="You skipped")).to_have_count(0)  # taken again
    Claim.objects.filter(item=second).update(skipped=True, expires_at=timezone.now())
    page.reload()
    skipped = page.get_by_role("region", name="You skipped")
    expect(skipped.get_by_role("link", name=f"Item {second.pk}")).to_be_visible()


def test_rate_candidates_and_try_again_with_the_keyboard(
    live_server: Any, page: Page, reviewer: Any
) -> None:
    queue = QueueFactory(members=[reviewer], reason_tags=["wrong facts"])
    (item,) = ready_items(queue, 1)
    first, second = item.generations.get().candidates.order_by("position")
    log_in(page, live_server.url, reviewer.username)
    start_reviewing(page, live_server.url, queue)

    page.keyboard.press("r")  # nothing picked or focused yet: it says why
    expect(page.get_by_text("Pick or focus a candidate first")).to_be_visible()
    page.keyboard.press("2")
    page.keyboard.press("r")
    page.keyboard.press("4")
    expect(page.get_by_text("Candidate 2 rated 4 of 5.")).to_be_visible()
    expect(page.locator(f"select[name=rating_{second.pk}]")).to_have_value("4")
    page.keyboard.press("1")
    page.keyboard.press("r")
    page.keyboard.press("2")
    page.keyboard.press("Shift+Digit1")
    with page.expect_navigation():
        page.keyboard.press("t")
    expect(page.get_by_text("Trying again")).to_be_visible()
    tried = item.generations.order_by("created_at").first()
    assert tried is not None and tried.try_again is not None
    assert tried.try_again["rewards"] == {str(first.pk): 0.25, str(second.pk): 0.75}
    assert tried.try_again["reasons"] == ["wrong facts"]
    assert item.generations.count() == 2 and not Decision.objects.exists()
    # Round 1 stays on the page, folded, one key press away from what was rated how.
    earlier = page.locator("details.earlier-round")
    expect(earlier.locator("summary")).to_contain_text("Round 1: 2 answers sent back")
    earlier.locator("summary").click()
    expect(earlier.get_by_text("rated, reward 0.75")).to_be_visible()
    expect(page.get_by_text("(after 1 round sent back with “try again”)")).to_be_visible()
    page.screenshot(path="var/test/screenshots/try-again-round-2.png")


def test_two_browsers_never_hold_the_same_item(
    live_server: Any, browser: Browser, reviewer: Any
) -> None:
    colleague = UserFactory()
    queue = QueueFactory(members=[reviewer, colleague])
    first, second = ready_items(queue, 2)
    mine, theirs = new_page(browser), new_page(browser)
    try:
        log_in(mine, live_server.url, reviewer.username)
        log_in(theirs, live_server.url, colleague.username)
        start_reviewing(mine, live_server.url, queue)
        start_reviewing(theirs, live_server.url, queue)
        expect(mine.get_by_role("heading", name=f"Item {first.pk}")).to_be_visible()
        expect(theirs.get_by_role("heading", name=f"Item {second.pk}")).to_be_visible()

        theirs.goto(f"{live_server.url}/items/{first.pk}/")
        expect(theirs.get_by_text(f"{reviewer.username} is reviewing this item")).to_be_visible()
        expect(theirs.get_by_label("Pick candidate 1")).to_have_count(0)
    finally:
        mine.context.close()
        theirs.context.close()


def test_a_draft_survives_a_reload(live_server: Any, page: Page, reviewer: Any) -> None:
    queue = QueueFactory(members=[reviewer])
    ready_items(queue, 1)
    log_in(page, live_server.url, reviewer.username)
    start_reviewing(page, live_server.url, queue)
    page.keyboard.press("2")
    page.keyboard.press("e")
    page.get_by_label("Your answer, from candidate 2").fill("A careful, corrected answer.")
    page.get_by_label("Comment").fill("half-written thought")
    page.reload()
    page.wait_for_load_state()
    expect(page.get_by_label("Your answer, from candidate 2")).to_have_value(
        "A careful, corrected answer."
    )
    expect(page.get_by_label("Comment")).to_have_value("half-written thought")
    expect(page.get_by_label("Pick candidate 2")).to_be_checked()
    page.keyboard.press("?")
    expect(page.get_by_role("dialog", name="Keyboard shortcuts")).to_be_visible()


def test_an_xss_payload_in_a_candidate_does_not_execute(
    live_server: Any, page: Page, reviewer: Any
) -> None:
    queue = QueueFactory(members=[reviewer])
    payloads = [
        '<img src=x onerror="alert(1)">**bold**',
        "<script>alert(2)</script>[link](javascript:alert(3))",
        '<a href="#" onclick="alert(4)">click</a><svg onload="alert(5)"></svg>',
    ]
    ready_items(queue, 1, payloads)
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    log_in(page, live_server.url, reviewer.username)
    start_reviewing(page, live_server.url, queue)

    texts = page.locator(".candidate-text")
    expect(texts).to_have_count(3)
    expect(page.locator(".candidate-text strong")).to_have_text("bold")  # markdown still works
    for selector in ["img", "script", "svg", "[onclick]", "[onerror]", "a[href^='javascript']"]:
        assert page.locator(f".candidate-text {selector}").count() == 0, selector
    page.get_by_text("click", exact=True).click()
    page.get_by_text("link", exact=True).click(no_wait_after=True)
    assert dialogs == []


def test_a_reviewer_edits_a_candidate_and_the_next_item_remembers_it(
    worker_process: WorkerProcess, live_server: Any, page: Page, reviewer: Any
) -> None:
    queue = QueueFactory(name="Support", n_candidates=3, members=[reviewer])
    log_in(page, live_server.url, reviewer.username)
    page.get_by_role("link", name="Support").click()
    page.get_by_label("Prompt or ticket").fill("My card has not arrived yet, where is it?")
    page.get_by_role("button", name="Generate candidates").click()
    expect(page.get_by_text("3 of 3 ready")).to_be_visible()

    page.get_by_text("Edit candidate 2").click()
    page.get_by_label("Your answer, from candidate 2").fill(
        "It was posted on Monday; allow 3 working days."
    )
    page.get_by_role("button", name="Submit decision").click()
    expect(page.get_by_text("Saved item")).to_be_visible()
    decision = Decision.objects.get()
    assert (decision.verdict, decision.reviewer_id) == ("edited", reviewer.pk)
    wait_for(lambda: not Example.objects.exclude(index_state="indexed").exists(), what="indexing")

    page.goto(f"{live_server.url}/q/{queue.slug}/")
    page.get_by_label("Prompt or ticket").fill("I still haven't received my card.")
    page.get_by_label("Candidates").fill("2")
    page.get_by_role("button", name="Generate candidates").click()
    expect(page.get_by_text("2 of 2 ready")).to_be_visible()
    retrieved = page.get_by_role("table").filter(has_text="Similarity")
    expect(retrieved).to_contain_text("It was posted on Monday; allow 3 working days.")
    expect(retrieved).to_contain_text(f"edited on item {decision.item_id}")


def test_a_refused_decision_keeps_the_draft(live_server: Any, page: Page, reviewer: Any) -> None:
    queue = QueueFactory(members=[reviewer])
    (item,) = ready_items(queue, 1)
    log_in(page, live_server.url, reviewer.username)
    start_reviewing(page, live_server.url, queue)
    page.keyboard.press("1")
    page.keyboard.press("e")
    page.get_by_label("Your answer, from candidate 1").fill("My careful rewrite.")
    # Meanwhile the claim lapses and a colleague decides the item.
    Claim.objects.update(expires_at=timezone.now())
    colleague = UserFactory()
    queue.members.add(colleague)
    candidate = item.generations.get().candidates.order_by("position")[1]
    decision_record(
        item_id=item.pk, reviewer=colleague, verdict="chosen", candidate_id=candidate.pk
    )
    page.keyboard.press("Control+Enter")
    expect(page.get_by_text("already been decided")).to_be_visible()
    draft = page.evaluate("Object.keys(localStorage).filter(k => k.startsWith('icrlhf:draft'))")
    assert len(draft) == 1
    assert "My careful rewrite." in page.evaluate(f"localStorage.getItem('{draft[0]}')")


def test_a_ticket_is_triaged_end_to_end(
    worker_process: WorkerProcess,
    fixed_llm: Any,
    live_server: Any,
    page: Page,
    reviewer: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def triage_answer(request: dict[str, Any]) -> tuple[int, bytes]:
        answer = fixed_llm.answer(request)
        for choice in answer["choices"]:  # one per candidate asked for (`n`)
            choice["message"]["content"] = (
                'Here you go: {"category": "exchange_rate", "priority": "low", '
                '"reply": "We will look into it."}'
            )
        return 200, json.dumps(answer).encode()

    monkeypatch.setattr(fixed_llm, "respond", triage_answer)
    queue = QueueFactory(
        name="Triage",
        kind="triage",
        n_candidates=2,
        members=[reviewer],
        categories=["card_arrival", "exchange_rate", "lost_or_stolen_card"],
    )
    item, _ = ticket_create(
        queue=queue,
        subject="Card never came",
        body="I ordered a card a month ago.",
        customer="ana@example.com",
        channel="email",
        priority="urgent",
        source="api",
    )
    log_in(page, live_server.url, reviewer.username)
    page.get_by_role("link", name="Triage").click()
    row = page.get_by_role("row").filter(has_text="Card never came")
    expect(row).to_contain_text("Urgent")
    expect(row).to_contain_text("New")
    row.get_by_role("link", name="Card never came").click()
    expect(page.get_by_text("2 of 2 ready")).to_be_visible()
    expect(page.locator(".triage-fields").first).to_contain_text("exchange_rate")
    page.wait_for_load_state()

    page.keyboard.press("1")
    expect(page.get_by_label("Category", exact=True)).to_have_value("exchange_rate")
    category = page.get_by_label("Category", exact=True)
    category.fill("")
    category.press_sequentially("card_ar")
    category.press("Enter")  # takes the highlighted match
    expect(category).to_have_value("card_arrival")
    page.get_by_label("Priority", exact=True).select_option("urgent")
    page.keyboard.press("Control+Enter")
    expect(page.get_by_text(f"Saved item {item.pk}: edited.")).to_be_visible()

    item.refresh_from_db()
    assert (item.category, item.priority, item.ticket_status) == ("card_arrival", "urgent", "open")
    page.goto(f"{live_server.url}/q/{queue.slug}/")
    expect(page.get_by_role("row").filter(has_text="Card never came")).to_have_count(0)
    page.goto(f"{live_server.url}/q/{queue.slug}/?category=card_arrival&review=decided")
    expect(page.get_by_role("row").filter(has_text="Card never came")).to_contain_text("Open")


def test_shortcut_keys_never_fire_inside_a_form_control(
    live_server: Any, page: Page, reviewer: Any
) -> None:
    """Typing into the triage drop-downs, the reply and the comment types there: "x" does not
    switch to none acceptable, "s" does not skip, "u" does not undo the previous ticket."""
    categories = ["card_arrival", "exchange_rate", "lost_or_stolen_card"]
    queue = QueueFactory(kind="triage", members=[reviewer], categories=categories)
    fields = {"category": "card_arrival", "priority": "low", "reply": "On its way."}
    first, second = ready_items(queue, 2, [json.dumps(fields), json.dumps(fields)])
    Candidate.objects.filter(generation__item__in=[first, second]).update(fields=fields)
    log_in(page, live_server.url, reviewer.username)
    start_reviewing(page, live_server.url, queue)
    page.keyboard.press("1")
    page.keyboard.press("Enter")
    expect(page.get_by_role("heading", name=f"Item {second.pk}")).to_be_visible()
    page.wait_for_load_state()
    page.keyboard.press("1")
    pick_one = page.get_by_label("Pick candidate 1")
    expect(pick_one).to_be_checked()

    category = page.get_by_label("Category", exact=True)
    category.focus()
    category.fill("")
    page.keyboard.type("exch")  # the combobox's matches: exchange_rate
    page.keyboard.press("Enter")
    expect(category).to_have_value("exchange_rate")
    priority = page.get_by_label("Priority", exact=True)
    priority.focus()
    page.keyboard.type("u")  # type-ahead for "urgent", not undo
    expect(priority).to_have_value("urgent")
    page.get_by_label("Reply").fill("")
    page.get_by_label("Reply").press_sequentially("Thanks, we are on it")
    page.get_by_label("Comment").press_sequentially("exchange issues")

    expect(pick_one).to_be_checked()
    expect(page.get_by_label("None acceptable")).not_to_be_checked()
    expect(page.get_by_role("heading", name=f"Item {second.pk}")).to_be_visible()
    assert Decision.objects.standing().filter(item=first).exists()  # not undone
    assert not Claim.objects.filter(item=second, skipped=True).exists()  # not skipped
    page.keyboard.press("Control+Enter")
    expect(page.get_by_text(f"Saved item {second.pk}: edited.")).to_be_visible()
    decision = Decision.objects.standing().get(item=second)
    assert decision.final_fields == {
        "category": "exchange_rate",
        "priority": "urgent",
        "reply": "Thanks, we are on it",
    }
    assert decision.comment == "exchange issues"


def test_undo_gives_a_triaged_ticket_back_its_fields_status_and_place(
    live_server: Any, page: Page, reviewer: Any
) -> None:
    queue = QueueFactory(
        name="Helpdesk", kind="triage", members=[reviewer], categories=["card_arrival"]
    )
    fields = {"category": "card_arrival", "priority": "urgent", "reply": "On its way."}
    ticket = ItemFactory(
        queue=queue,
        subject="Card never came",
        body="Ordered a month ago.",
        priority="low",
        sla_due_at=timezone.now() + timezone.timedelta(hours=8),
    )
    ready_generation(ticket, [json.dumps(fields)])
    Candidate.objects.filter(generation__item=ticket).update(fields=fields)
    log_in(page, live_server.url, reviewer.username)
    start_reviewing(page, live_server.url, queue)
    page.keyboard.press("1")
    page.keyboard.press("Enter")
    expect(page.get_by_text(f"Saved item {ticket.pk}: chosen.")).to_be_visible()
    page.wait_for_load_state()
    page.keyboard.press("u")
    expect(page.get_by_text(f"Undone: item {ticket.pk}")).to_be_visible()

    page.goto(f"{live_server.url}/q/{queue.slug}/")
    row = page.get_by_role("row").filter(has_text="Card never came")
    expect(row).to_contain_text("Low")
    expect(row).to_contain_text("New")
    expect(row).not_to_contain_text("card_arrival")
    ticket.refresh_from_db()
    assert (ticket.category, ticket.priority, ticket.ticket_status, ticket.triaged_at) == (
        "",
        "low",
        "new",
        None,
    )


def test_one_undo_banner_counts_down_and_goes_when_its_window_ends(
    live_server: Any, page: Page, reviewer: Any, settings: Any
) -> None:
    settings.REVIEW_UNDO_WINDOW_S = 4
    queue = QueueFactory(members=[reviewer])
    (item,) = ready_items(queue, 1)
    log_in(page, live_server.url, reviewer.username)
    start_reviewing(page, live_server.url, queue)
    page.keyboard.press("1")
    page.keyboard.press("Enter")
    # The last item: the queue page still offers the undo, in one banner.
    expect(page.get_by_role("heading", name=f"Review: {queue.name}")).to_be_visible()
    expect(page.get_by_text(f"Saved item {item.pk}: chosen.")).to_have_count(1)
    expect(page.get_by_text("s left to undo")).to_be_visible()
    expect(page.locator("#undo-form")).to_have_count(0, timeout=8_000)
    page.keyboard.press("u")  # the window has passed: nothing to undo, nothing said
    expect(page.get_by_text("The undo window has passed")).to_have_count(0)
    assert Decision.objects.standing().filter(item=item).exists()


def test_triage_corrections_search_categories_and_start_from_an_invalid_answer(
    live_server: Any, page: Page, reviewer: Any
) -> None:
    categories = [f"topic_{n:02d}" for n in range(40)] + [
        "exchange_rate",
        "lost_or_stolen_card",
        "card_arrival",
    ]
    queue = QueueFactory(kind="triage", members=[reviewer], categories=categories)
    valid = {"category": "exchange_rate", "priority": "low", "reply": "Rates move daily."}
    raw = "Priority: high\nCategory: something else entirely\nSorry about the fee."
    (item,) = ready_items(queue, 1, [json.dumps(valid), raw])
    candidates = Candidate.objects.filter(generation__item=item).order_by("position")
    Candidate.objects.filter(pk=candidates[0].pk).update(fields=valid)
    Candidate.objects.filter(pk=candidates[1].pk).update(parse_error="No category fits.")
    log_in(page, live_server.url, reviewer.username)
    start_reviewing(page, live_server.url, queue)

    category = page.get_by_label("Category", exact=True)
    category.focus()
    options = page.get_by_role("listbox", name="Matching categories").get_by_role("option")
    expect(options.first).to_contain_text("exchange_rate")  # proposed first, then sorted
    expect(options.nth(1)).to_have_text("card_arrival")
    category.press("Escape")
    page.keyboard.press("Escape")
    page.keyboard.press("2")  # the invalid answer: what could be read, and its raw text
    expect(page.get_by_label("Priority", exact=True)).to_have_value("high")
    expect(category).to_have_value("")
    expect(page.get_by_label("Reply")).to_have_value(raw)

    category.focus()
    page.keyboard.type("stolen")
    expect(page.get_by_role("listbox", name="Matching categories")).to_be_visible()
    page.keyboard.press("Enter")  # takes the highlighted match
    expect(category).to_have_value("lost_or_stolen_card")
    expect(category).to_be_focused()
    page.keyboard.press("Control+Enter")
    expect(page.get_by_text(f"Saved item {item.pk}: edited.")).to_be_visible()
    decision = Decision.objects.standing().get(item=item)
    assert decision.final_fields == {
        "category": "lost_or_stolen_card",
        "priority": "high",
        "reply": raw,
    }


def test_e_corrects_a_triage_candidates_category_in_four_keys_plus_typing(
    live_server: Any, page: Page, reviewer: Any
) -> None:
    queue = QueueFactory(
        kind="triage", members=[reviewer], categories=["card_arrival", "lost_or_stolen_card"]
    )
    valid = {"category": "card_arrival", "priority": "low", "reply": "It is on its way."}
    (item,) = ready_items(queue, 1, [json.dumps(valid), json.dumps(valid)])
    Candidate.objects.filter(generation__item=item).update(fields=valid)
    log_in(page, live_server.url, reviewer.username)
    start_reviewing(page, live_server.url, queue)

    page.keyboard.press("1")
    page.keyboard.press("e")  # to the category box, its value selected: typing replaces it
    category = page.get_by_label("Category", exact=True)
    expect(category).to_be_focused()
    expect(category).to_have_value("card_arrival")
    page.keyboard.type("stol")
    page.keyboard.press("Enter")  # takes the highlighted match
    page.keyboard.press("Control+Enter")
    expect(page.get_by_text(f"Saved item {item.pk}: edited.")).to_be_visible()
    decision = Decision.objects.standing().get(item=item)
    assert decision.final_fields == {**valid, "category": "lost_or_stolen_card"}


def test_the_small_things_a_reviewer_meets_all_day(
    live_server: Any, browser: Browser, reviewer: Any
) -> None:
    """The favicon answers; a link the model wrote is marked and shows its target;
    regenerating asks first; the ticket list fits a phone and its badges stay on one line."""
    queue = QueueFactory(members=[reviewer])
    (item,) = ready_items(queue, 1, ["See [our fees](https://evil.example/fees) page.", "Two"])
    desktop = browser.new_context(viewport={"width": 1366, "height": 900}).new_page()
    log_in(desktop, live_server.url, reviewer.username)
    assert desktop.request.get(f"{live_server.url}/favicon.ico").status == 200

    start_reviewing(desktop, live_server.url, queue)
    link = desktop.get_by_role("link", name="our fees")
    expect(link).to_have_attribute("rel", "noopener noreferrer nofollow ugc")
    shown = link.evaluate("a => getComputedStyle(a, '::after').content")
    assert "https://evil.example/fees" in shown

    asked: list[str] = []
    desktop.on("dialog", lambda dialog: (asked.append(dialog.message), dialog.dismiss()))
    desktop.get_by_role("button", name="Regenerate all candidates").click()
    expect(desktop.get_by_role("heading", name=f"Item {item.pk}")).to_be_visible()
    assert asked and "Replace all 2 candidates" in asked[0]
    assert item.generations.count() == 1  # dismissed: nothing regenerated
    desktop.context.close()

    triage = QueueFactory(
        name="Helpdesk",
        kind="triage",
        members=[reviewer],
        # A long name widens a drop-down to it: the filter's must still fit the phone.
        categories=["card_payment_wrong_exchange_rate_for_cash_withdrawal_abroad"],
    )
    for number in range(3):
        ItemFactory(
            queue=triage,
            subject=f"A rather long subject line for ticket number {number}",
            body="Body",
            customer="someone.with.a.long.address@example.com",
            channel="email",
            priority="urgent",
            sla_due_at=timezone.now() + timezone.timedelta(hours=1),
        )
    phone = browser.new_context(viewport={"width": 390, "height": 844}).new_page()
    log_in(phone, live_server.url, reviewer.username)
    phone.goto(f"{live_server.url}/q/{triage.slug}/")
    assert phone.evaluate("document.documentElement.scrollWidth") <= 390
    badge = phone.locator(".badge.ready").first
    height = badge.evaluate("b => b.getBoundingClientRect().height")
    line = badge.evaluate("b => parseFloat(getComputedStyle(b).lineHeight) || 20")
    assert height < 1.8 * line  # one line
    phone.context.close()


def test_candidates_are_pickable_as_they_arrive_and_polling_keeps_what_is_typed(
    live_server: Any, page: Page, reviewer: Any
) -> None:
    queue = QueueFactory(members=[reviewer], n_candidates=2)
    item = ItemFactory(queue=queue, status=Item.Status.GENERATING)
    generation = GenerationFactory(item=item, n_candidates=2, status=Generation.Status.RUNNING)
    first = CandidateFactory(generation=generation, position=0, text="The card ships today.")
    late = CandidateFactory(generation=generation, position=1, status=Candidate.Status.RUNNING)
    log_in(page, live_server.url, reviewer.username)
    start_reviewing(page, live_server.url, queue)  # offered with one candidate finished
    expect(page.get_by_text("1 of 2 ready")).to_be_visible()

    page.keyboard.press("1")
    page.keyboard.press("e")
    # By id: once both have arrived the ranking (run by a worker when one is up) may
    # renumber them, and the pick and the edit follow their candidate.
    editor = page.locator(f"#edit-{first.pk}")
    editor.press("End")
    editor.press_sequentially(" Tracking follows by mail.")
    page.get_by_label("Comment").fill("Good start")
    scrolled = page.evaluate("window.scrollY")

    Candidate.objects.filter(pk=late.pk).update(status=Candidate.Status.DONE, text="Late one.")
    pipeline.generation_finish_if_complete(generation_id=generation.pk)
    expect(page.get_by_text("2 of 2 ready")).to_be_visible()
    expect(page.locator(f"#choice-{late.pk}")).to_be_visible()

    expect(page.locator(f"#choice-{first.pk}")).to_be_checked()
    expect(editor).to_have_value("The card ships today. Tracking follows by mail.")
    expect(editor).to_be_visible()  # its panel still open
    expect(page.get_by_label("Comment")).to_have_value("Good start")
    assert abs(page.evaluate("window.scrollY") - scrolled) < 5
    page.keyboard.press("Control+Enter")
    expect(page.get_by_text(f"Saved item {item.pk}: edited.")).to_be_visible()
    decision = Decision.objects.standing().get(item=item)
    assert decision.final_text == "The card ships today. Tracking follows by mail."
    assert decision.comment == "Good start"


def test_the_candidates_side_by_side_with_the_decision_always_in_reach(
    live_server: Any, browser: Browser, reviewer: Any
) -> None:
    queue = QueueFactory(members=[reviewer], n_candidates=4)
    long_answer = "\n\n".join(
        f"Paragraph {n} of a long answer about card delivery." for n in range(30)
    )
    (item,) = ready_items(queue, 1, ["Short one.", long_answer, "Third.", "Fourth."])
    generation = item.generations.get()
    generation.params = {"max_tokens": 64}
    generation.save()
    Candidate.objects.filter(generation=generation, position=1).update(completion_tokens=64)
    page = browser.new_context(viewport={"width": 1366, "height": 900}).new_page()
    log_in(page, live_server.url, reviewer.username)
    start_reviewing(page, live_server.url, queue)

    tops = [
        page.locator(f"article[data-label='{n}']").evaluate(
            "a => Math.round(a.getBoundingClientRect().top)"
        )
        for n in (1, 2, 3)
    ]
    assert len(set(tops)) == 1 and tops[0] < 450  # side by side, near the top
    submit = page.get_by_role("button", name="Submit decision")
    expect(submit).to_be_in_viewport()  # without scrolling, wherever the reviewer is
    page.mouse.wheel(0, 600)
    expect(submit).to_be_in_viewport()
    second = page.locator("article[data-label='2']")
    expect(second.get_by_text("cut at the token limit")).to_be_visible()
    text = second.locator(".candidate-text")
    height = "e => e.getBoundingClientRect().height"
    assert text.evaluate(height) < 300  # folded: its first lines
    second.get_by_role("button", name="Show all").click()
    assert text.evaluate(height) > 900

    page.keyboard.press("3")
    page.keyboard.press("e")
    third = page.locator("article[data-label='3']")
    expect(third.locator(".candidate-text")).to_be_hidden()  # the editor takes its place
    expect(third.get_by_label("Your answer, from candidate 3")).to_have_value("Third.")
    page.context.close()


def test_orientation_progress_remembered_playbook_reason_keys_and_the_edit_diff(
    live_server: Any, page: Page, reviewer: Any
) -> None:
    queue = QueueFactory(
        members=[reviewer],
        reason_tags=["wrong facts", "too long"],
        playbook=[("Tone", "Be brief.")],
    )
    first, second = ready_items(queue, 2, ["The card ships in five days.", "Other."])
    log_in(page, live_server.url, reviewer.username)
    start_reviewing(page, live_server.url, queue)
    expect(page.locator("progress")).to_have_attribute("max", "2")
    page.get_by_text("Playbook (version 1)").click()  # opened once...
    label = page.locator("article.candidate", has_text="five days").get_attribute("data-label")
    page.keyboard.press(str(label))
    page.keyboard.press("Shift+2")  # the second reason, by key
    expect(page.get_by_label("too long")).to_be_checked()
    page.keyboard.press("e")
    editor = page.get_by_label(f"Your answer, from candidate {label}")
    editor.fill("The card ships in two days.")
    page.keyboard.press("Control+Enter")
    expect(page.get_by_role("heading", name=f"Item {second.pk}")).to_be_visible()
    expect(page.locator("details.playbook")).to_have_attribute("open", "")  # ...stays open
    expect(page.locator("progress")).to_have_attribute("value", "1")

    decided = Decision.objects.standing().get(item=first)
    assert decided.reason_tags == ["too long"]
    page.goto(f"{live_server.url}/items/{first.pk}/")
    page.get_by_text(f"Changes from candidate {decided.chosen_candidate.label}").click()
    diff = page.locator(".edit-diff .diff")
    expect(diff.locator("del")).to_have_text("five")
    expect(diff.locator("ins")).to_have_text("two")


def test_the_curators_examples_list_and_page_agree(live_server: Any, browser: Browser) -> None:
    admin = UserFactory(is_staff=True, is_superuser=True)
    queue = QueueFactory(curators=[admin])
    (item,) = ready_items(queue, 1, ["A long answer " * 20, "Second answer."])
    decision = decision_record(
        item_id=item.pk,
        reviewer=admin,
        verdict="chosen",
        candidate_id=item.generations.get().candidates.order_by("position").first().pk,
    )
    Example.objects.filter(decision=decision).update(
        times_retrieved=1, times_accepted=1, utility=2 / 3
    )
    page = browser.new_context(viewport={"width": 1366, "height": 900}).new_page()
    log_in(page, live_server.url, admin.username)
    page.goto(f"{live_server.url}/admin/memory/example/")
    expect(page.get_by_text("0.67").first).to_be_visible()
    expect(page.get_by_text("0.6666")).to_have_count(0)
    assert page.evaluate("document.documentElement.scrollWidth") <= 1366
    expect(page.locator("th.column-short_output")).to_be_visible()

    preferred = Example.objects.get(decision=decision, role="preferred")
    page.goto(f"{live_server.url}/admin/memory/example/{preferred.pk}/change/")
    usage = page.locator(".field-usage .readonly")
    expect(usage).to_contain_text("utility 0.67")

    review_decisions.decision_undo(decision_id=decision.pk, reviewer=admin)
    page.goto(f"{live_server.url}/admin/memory/example/")
    expect(
        page.get_by_text(f"Retired: Withdrawn: decision {decision.pk} was undone.").first
    ).to_be_visible()
    page.goto(f"{live_server.url}/admin/memory/curationevent/")
    expect(page.get_by_role("cell", name="retire").first).to_be_visible()
    page.context.close()


def test_wide_screens_keep_the_playbook_beside_the_work_and_the_api_docs_lead_back(
    live_server: Any, browser: Browser, reviewer: Any
) -> None:
    queue = QueueFactory(members=[reviewer], playbook=[("Rules", "Be brief.")])
    ready_items(queue, 1)
    page = browser.new_context(viewport={"width": 1920, "height": 1080}).new_page()
    log_in(page, live_server.url, reviewer.username)
    start_reviewing(page, live_server.url, queue)
    box = page.locator("details.playbook").bounding_box()
    first = page.locator("article[data-label='1']").bounding_box()
    assert box is not None and first is not None
    assert box["x"] > first["x"] + first["width"]  # a side panel, right of the candidates
    assert box["y"] < first["y"]  # in view from the top

    page.goto(f"{live_server.url}/api/v1/docs")
    page.get_by_role("link", name="Back to icrlhf").click()
    expect(page.get_by_role("heading", name="Queues")).to_be_visible()
    page.context.close()


def shown_candidates(page: Page) -> list[tuple[str, str, str]]:
    """(number, candidate id, text) of each candidate on the page, in its order."""
    return [
        (
            card.get_attribute("data-label") or "",
            card.get_attribute("data-candidate-id") or "",
            card.locator(".candidate-text").inner_text()
            if card.locator(".candidate-text").count()
            else "",
        )
        for card in page.locator("article.candidate").all()
    ]


def test_a_memory_candidate_first_then_answers_then_the_ranking_show_what_a_reload_shows(
    live_server: Any, page: Page, reviewer: Any
) -> None:
    """The race reviewers met: the memory candidate arrives first in slot 2, the model's
    answers arrive, then the ranking renumbers them. Never one candidate twice or one hidden,
    the pick follows its candidate, and the page equals a reload."""
    queue = QueueFactory(members=[reviewer], n_candidates=4)
    item = ItemFactory(queue=queue, status=Item.Status.GENERATING)
    generation = GenerationFactory(item=item, n_candidates=4, status=Generation.Status.RUNNING)
    waiting = [
        CandidateFactory(
            generation=generation, position=p, status=Candidate.Status.RUNNING, text=""
        )
        for p in (0, 2, 3)
    ]
    memory = CandidateFactory(
        generation=generation, position=1, source=Candidate.Source.MEMORY, text="From memory."
    )
    log_in(page, live_server.url, reviewer.username)
    start_reviewing(page, live_server.url, queue)
    expect(page.get_by_text("1 of 4 ready")).to_be_visible()
    page.keyboard.press("2")
    expect(page.get_by_label("Pick candidate 2")).to_be_checked()

    for number, candidate in enumerate(waiting):
        Candidate.objects.filter(pk=candidate.pk).update(
            status=Candidate.Status.DONE, text=f"Model answer {number}."
        )
    # Finished as the pipeline finishes it, without sending the ranking to a worker: the test
    # renumbers them itself below, at a moment it chooses.
    Generation.objects.filter(pk=generation.pk).update(
        status=Generation.Status.DONE, finished_at=timezone.now()
    )
    Item.objects.filter(pk=item.pk).update(status=Item.Status.READY)
    expect(page.get_by_text("4 of 4 ready")).to_be_visible()
    expect(page.locator("article.candidate.done")).to_have_count(4)

    # The ranking puts the memory candidate first and the others after it (two steps, as
    # positions are unique), as icrlhf.generation.ranking does.
    order = [memory, waiting[2], waiting[0], waiting[1]]
    Candidate.objects.filter(generation=generation).update(position=F("position") + 10)
    for position, candidate in enumerate(order):
        Candidate.objects.filter(pk=candidate.pk).update(position=position)
    Generation.objects.filter(pk=generation.pk).update(
        ranked_at=timezone.now(), finished_at=timezone.now()
    )
    expect(page.locator("article.candidate").first).to_have_attribute(
        "data-candidate-id", str(memory.pk)
    )
    expect(page.locator("#live[hx-get]")).to_have_count(0)  # settled: polling stopped

    live = shown_candidates(page)
    ids = [card[1] for card in live]
    assert ids == [str(c.pk) for c in order] and len(set(ids)) == 4
    expect(page.get_by_label("Pick candidate 1")).to_be_checked()  # the pick followed it
    page.keyboard.press("e")
    expect(page.get_by_label("Your answer, from candidate 1")).to_have_value("From memory.")
    page.keyboard.press("Escape")
    page.reload()
    page.wait_for_load_state()
    assert shown_candidates(page) == live
    page.keyboard.press("1")
    page.keyboard.press("Enter")
    expect(page.get_by_text(f"Saved item {item.pk}: chosen.")).to_be_visible()
    assert Decision.objects.get().chosen_candidate_id == memory.pk


def test_a_page_whose_candidates_disagree_with_the_server_refuses_to_submit(
    live_server: Any, page: Page, reviewer: Any
) -> None:
    queue = QueueFactory(members=[reviewer])
    (item,) = ready_items(queue, 1, ["First.", "Second."])
    log_in(page, live_server.url, reviewer.username)
    start_reviewing(page, live_server.url, queue)
    page.keyboard.press("1")
    # What the race did: one candidate shown twice, in another's place.
    page.evaluate(
        """() => { const cards = document.querySelectorAll('article.candidate');
                   cards[1].replaceWith(cards[0].cloneNode(true)); }"""
    )
    page.keyboard.press("Enter")
    expect(page.locator("#stale-page")).to_contain_text("out of date, so nothing was submitted")
    assert not Decision.objects.exists()
    page.wait_for_load_state()
    expect(page.locator("article.candidate")).to_have_count(2, timeout=10_000)  # reloaded
    expect(page.locator("#stale-page")).to_be_hidden()
    expect(page.get_by_label("Pick candidate 1")).to_be_checked()  # the draft kept the pick
    page.keyboard.press("Enter")
    expect(page.get_by_text(f"Saved item {item.pk}: chosen.")).to_be_visible()


def test_the_category_combobox_prefers_an_exact_name_then_word_starts(
    live_server: Any, page: Page, reviewer: Any
) -> None:
    categories = ["card_payment_wrong_exchange_rate", "exchange_rate", "Refund_not_showing_up"]
    categories += ["rate_limit", "card_arrival"]
    queue = QueueFactory(kind="triage", members=[reviewer], categories=categories)
    fields = {"category": "card_arrival", "priority": "low", "reply": "On its way."}
    (item,) = ready_items(queue, 1, [json.dumps(fields)])
    Candidate.objects.filter(generation__item=item).update(fields=fields)
    log_in(page, live_server.url, reviewer.username)
    start_reviewing(page, live_server.url, queue)
    page.keyboard.press("1")

    category = page.get_by_role("combobox", name="Category")
    category.focus()
    category.fill("")
    listbox = page.get_by_role("listbox", name="Matching categories")
    expect(listbox).to_be_visible()
    names = listbox.get_by_role("option").all_inner_texts()
    assert names[1:] == sorted(names[1:]) and "refund_not_showing_up" in names  # normalised

    page.keyboard.type("exchange_rate")
    expect(category).to_have_attribute("aria-expanded", "true")
    options = listbox.get_by_role("option")
    expect(options.first).to_have_text("exchange_rate")  # the exact name wins
    expect(options.first).to_have_attribute("aria-selected", "true")
    expect(options.nth(1)).to_have_text("card_payment_wrong_exchange_rate")
    category.fill("")
    page.keyboard.type("rate")
    expect(options.first).to_have_text("rate_limit")  # the name's start, then a word's start
    expect(options.nth(1)).to_have_text("card_payment_wrong_exchange_rate")
    expect(listbox.get_by_role("option", name="card_arrival")).to_be_hidden()
    page.keyboard.press("ArrowDown")
    expect(options.nth(1)).to_have_attribute("aria-selected", "true")
    page.keyboard.press("Enter")
    expect(category).to_have_value("card_payment_wrong_exchange_rate")
    expect(listbox).to_be_hidden()
    page.keyboard.press("Control+Enter")
    expect(page.get_by_text(f"Saved item {item.pk}: edited.")).to_be_visible()
    assert Decision.objects.get().final_fields["category"] == "card_payment_wrong_exchange_rate"


def test_candidates_and_the_decision_are_in_view_together_and_nothing_moves(
    live_server: Any, browser: Browser, reviewer: Any, settings: Any
) -> None:
    """At 1366×900, four candidates or a triage ticket's three and the decision controls are
    all in view on load; the comment's label is beside its box; the undo banner's end does not
    move the page; on a phone the triage form fits the screen."""
    settings.REVIEW_UNDO_WINDOW_S = 3
    body = "\n".join(f"Line {n} of a customer's long message." for n in range(12))
    general = QueueFactory(members=[reviewer], n_candidates=4)
    long_answer = " ".join(["A long answer about the card's delivery."] * 40)
    ready_items(general, 2, [long_answer] * 4)
    categories = [f"category_{n:02d}" for n in range(77)]
    triage = QueueFactory(kind="triage", members=[reviewer], categories=categories)
    fields = {"category": "category_01", "priority": "low", "reply": long_answer}
    (ticket,) = ready_items(triage, 1, [json.dumps(fields)] * 3)
    Item.objects.filter(pk=ticket.pk).update(subject="Card", body=body, channel="email")
    Candidate.objects.filter(generation__item=ticket).update(fields=fields)

    page = browser.new_context(viewport={"width": 1366, "height": 900}).new_page()
    log_in(page, live_server.url, reviewer.username)

    def all_in_view() -> None:
        bar = page.locator("#verdict").bounding_box()
        assert bar is not None and bar["y"] + bar["height"] <= 900
        for card in page.locator("article.candidate").all():
            heading, pick = card.locator("h3").bounding_box(), card.locator(".pick").bounding_box()
            assert heading is not None and pick is not None
            assert heading["y"] >= 0 and pick["y"] + pick["height"] <= bar["y"], (
                heading,
                pick,
                bar,
            )

    for queue in (general, triage):
        start_reviewing(page, live_server.url, queue)
        all_in_view()
    label = page.locator("label[for=comment]").bounding_box()
    box = page.locator("#comment").bounding_box()
    assert label is not None and box is not None
    assert box["x"] - (label["x"] + label["width"]) < 24 and abs(label["y"] - box["y"]) < 24

    start_reviewing(page, live_server.url, general)
    page.keyboard.press("1")
    page.keyboard.press("Enter")
    expect(page.locator("#undo-form")).to_be_visible()
    page.wait_for_load_state()
    top = page.locator("h1").evaluate("h => h.getBoundingClientRect().top")
    expect(page.locator("#undo-form")).to_have_count(0, timeout=8_000)
    assert page.locator("h1").evaluate("h => h.getBoundingClientRect().top") == top
    page.context.close()

    phone = browser.new_context(viewport={"width": 390, "height": 844}).new_page()
    log_in(phone, live_server.url, reviewer.username)
    phone.goto(f"{live_server.url}/items/{ticket.pk}/")
    phone.wait_for_load_state()
    assert phone.evaluate("document.documentElement.scrollWidth") <= 390
    phone.keyboard.press("?")
    expect(phone.locator("#keymap")).to_be_visible()
    assert phone.evaluate("document.documentElement.scrollWidth") <= 390
    dialog = phone.locator("#keymap").bounding_box()
    assert dialog is not None and dialog["x"] >= 0 and dialog["x"] + dialog["width"] <= 390
    phone.context.close()


def test_keys_that_cannot_act_say_why_and_editing_keeps_the_candidate_in_view(
    live_server: Any, browser: Browser, reviewer: Any, settings: Any
) -> None:
    settings.REVIEW_UNDO_WINDOW_S = 0
    queue = QueueFactory(members=[reviewer])
    ready_items(queue, 1, ["The card ships in five days.", "Other."])
    page = browser.new_context(viewport={"width": 1366, "height": 900}).new_page()
    log_in(page, live_server.url, reviewer.username)
    start_reviewing(page, live_server.url, queue)

    page.keyboard.press("Enter")
    expect(page.locator("#key-hint")).to_contain_text("Pick a candidate first")
    page.keyboard.press("u")
    expect(page.locator("#key-hint")).to_contain_text("Nothing to undo")
    assert not Decision.objects.exists()

    card = page.locator("article.candidate", has_text="five days")
    page.keyboard.press(str(card.get_attribute("data-label")))
    page.keyboard.press("e")
    original = card.locator(".edit-original")
    expect(original).to_contain_text("The card ships in five days.")
    editor = card.get_by_role("textbox")
    editor.fill("A parcel leaves in five days.")
    left, right = original.bounding_box(), editor.bounding_box()
    assert left is not None and right is not None and left["x"] + left["width"] <= right["x"]
    expect(card.locator(".diff del")).to_have_text("The card ships")  # one rewrite, not
    expect(card.locator(".diff ins")).to_have_text("A parcel leaves")  # three swapped words
    page.context.close()
