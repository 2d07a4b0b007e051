"""Reviewing an agent's step in a real browser (Debian's Chromium, Playwright, the live
server): the first screen shows the state the agent decided from, compactly, and every
candidate next action with its pick control, at a laptop's size; a phone shows the state and
the first candidate without the conversation filling the screen."""

import json
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, expect

from icrlhf.queues.models import Item
from tests.factories import CandidateFactory, GenerationFactory, QueueFactory, UserFactory
from tests.support.browser import log_in, new_page

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

SCREENSHOTS = Path(__file__).resolve().parents[2] / "var" / "test" / "screenshots"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{name.replace('_', ' ')} of an order",
            "parameters": {
                "type": "object",
                "properties": {
                    "order_id": {"type": "string"},
                    "note": {"type": "string"},
                    "amount": {"type": "number"},
                },
                "required": ["order_id"],
            },
        },
    }
    for name in ("lookup_order", "refund", "escalate", "send_message")
]
GOAL = "My order 4821 arrived broken and the replacement never came. I want my money back."


def tool_call(number: int, name: str, arguments: dict[str, str]) -> dict[str, Any]:
    return {
        "id": f"call_{number}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


def long_run() -> list[dict[str, Any]]:
    """A run several steps long, whose tool results are long: the page must not make the
    reviewer scroll through it to reach the candidates."""
    conversation: list[dict[str, Any]] = [{"role": "user", "content": GOAL}]
    for number in range(1, 4):
        conversation += [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [tool_call(number, "lookup_order", {"order_id": "4821"})],
            },
            {
                "role": "tool",
                "tool_call_id": f"call_{number}",
                "content": json.dumps(
                    {
                        "order_id": "4821",
                        "status": "delivered damaged" if number < 3 else "replacement lost",
                        "history": [f"event {n}: parcel scanned at depot {n}" for n in range(12)],
                    }
                ),
            },
        ]
    return conversation


def captured_step(queue: Any) -> Item:
    conversation = long_run()
    item = Item.objects.create(
        queue=queue,
        input_text=f"{GOAL}\n\n{conversation[-1]['content']}",
        source=Item.Source.GATEWAY,
        status=Item.Status.READY,
        conversation=conversation,
        call_options={"tools": TOOLS},
    )
    generation = GenerationFactory(item=item, n_candidates=4)
    actions = [
        ("refund", {"order_id": "4821", "note": "Damaged and replacement lost."}),
        ("escalate", {"order_id": "4821", "note": "Two failed deliveries."}),
        ("send_message", {"order_id": "4821", "note": "We are sorry; a refund is on its way."}),
        ("lookup_order", {"order_id": "4821"}),
    ]
    for position, (name, arguments) in enumerate(actions):
        CandidateFactory(
            generation=generation,
            position=position,
            text="",
            tool_calls=[tool_call(10 + position, name, arguments)],
        )
    return item


def test_a_steps_state_and_every_candidates_pick_are_on_the_first_screen(
    live_server: Any, browser: Browser
) -> None:
    queue = QueueFactory(n_candidates=4)
    reviewer = UserFactory()
    queue.members.add(reviewer)
    item = captured_step(queue)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)

    page = new_page(browser, width=1366, height=900)
    log_in(page, live_server.url, reviewer.username)
    page.goto(f"{live_server.url}/items/{item.pk}/")
    page.wait_for_load_state()
    # The state the agent decided from: the goal and the latest observation, at the top.
    state = page.locator("#step-state")
    expect(state.locator(".goal").get_by_text(GOAL)).to_be_visible()
    expect(state.locator(".observation").get_by_text("replacement lost")).to_be_visible()
    # Earlier turns are folded, one click away.
    expect(state.locator("details.earlier-turns")).not_to_have_attribute("open", "")
    page.screenshot(path=str(SCREENSHOTS / "step-item-desktop.png"))
    # Above the decision bar, which stays at the bottom of the window.
    bar = page.locator("#verdict").bounding_box()
    assert bar is not None
    picks = page.locator(".candidate .pick label")
    expect(picks).to_have_count(4)
    for number in range(4):
        box = picks.nth(number).bounding_box()
        assert box is not None, number
        assert box["y"] >= 0 and box["y"] + box["height"] <= bar["y"], (number, box, bar)
        assert box["x"] >= 0 and box["x"] + box["width"] <= 1366, (number, box)
    # Picked by its key, as the keymap says.
    page.keyboard.press("3")
    expect(page.locator("input[name=choice]:checked")).to_have_count(1)
    page.context.close()

    phone = new_page(browser, width=390, height=844, phone=True)
    log_in(phone, live_server.url, reviewer.username)
    phone.goto(f"{live_server.url}/items/{item.pk}/")
    phone.wait_for_load_state()
    phone.screenshot(path=str(SCREENSHOTS / "step-item-phone.png"))
    first = phone.locator(".candidate .pick label").first.bounding_box()
    width = phone.evaluate("document.documentElement.scrollWidth")
    assert width <= 390, width  # nothing wider than the phone
    assert first is not None and first["y"] + first["height"] <= 2 * 844, first
    phone.context.close()


def tab_to(page: Any, name_ending: str) -> None:
    """Tab to the field whose name ends so (the fields' order is the schema's, which a
    database may store in another order than written)."""
    for key in ["Tab"] * 6 + ["Shift+Tab"] * 12:  # forward a little, else back
        page.keyboard.press(key)
        if page.evaluate("document.activeElement.name || ''").endswith(name_ending):
            return
    raise AssertionError(f"No field named …{name_ending} near the focus")


def test_the_tool_call_editors_diff_follows_each_keystroke_and_a_refused_submit_keeps_it(
    live_server: Any, browser: Browser
) -> None:
    queue = QueueFactory(n_candidates=4)
    reviewer = UserFactory()
    queue.members.add(reviewer)
    item = captured_step(queue)
    page = new_page(browser, width=1366, height=900)
    log_in(page, live_server.url, reviewer.username)
    page.goto(f"{live_server.url}/items/{item.pk}/")
    page.wait_for_load_state()
    page.keyboard.press("1")
    page.keyboard.press("e")  # the picked candidate's editor, its tool first
    expect(page.locator("details.editor[open] select.tool-choice")).to_be_focused()
    tab_to(page, "__order_id")
    page.keyboard.press("Control+a")
    page.keyboard.type("5678")
    diff = page.locator("details.editor[open] .diff")
    expect(diff.locator("del", has_text="4821")).to_have_count(1)
    expect(diff.locator("ins", has_text="5678")).to_have_count(1)
    tab_to(page, "__amount")  # which the schema says is a number
    page.keyboard.type("lots")
    expect(diff.locator("ins", has_text="lots")).to_have_count(1)
    page.keyboard.press("Control+Enter")
    expect(page.get_by_text("amount must be a number")).to_be_visible()
    # Refused: nothing saved, and what the reviewer typed is still there, diff and all.
    editor = page.locator("details.editor[open]")
    expect(editor.locator("input[name$='__order_id']:visible")).to_have_value("5678")
    expect(editor.locator("input[name$='__amount']:visible")).to_have_value("lots")
    expect(editor.locator(".diff ins", has_text="5678")).to_have_count(1)
    page.screenshot(path=str(SCREENSHOTS / "step-item-refused-edit.png"))
    page.context.close()
