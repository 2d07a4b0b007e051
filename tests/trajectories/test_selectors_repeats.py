"""The run's page flags a loop: a step calling a tool again, with the same arguments, after the
run already had that call's result."""

import json
from typing import Any

import pytest
from django.test import Client

from icrlhf.trajectories.selectors import RepeatedCall, repeated_calls_of, steps_of
from tests.factories import QueueFactory, UserFactory, agent_step

pytestmark = pytest.mark.django_db

HOSTILE_TOOL = "look<script>alert(1)</script>"
GOAL = {"role": "user", "content": "Where is order 4821?"}


def _call(call_id: str, arguments: dict[str, Any], name: str = HOSTILE_TOOL) -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


def _made(call: dict[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": [call]}


def _result(call_id: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": "In transit."}


def _run(queue: Any, calls: list[dict[str, Any]]) -> list[Any]:
    """A run that makes `calls` one step at a time, each answered before the next step."""
    conversation: list[dict[str, Any]] = [GOAL]
    first = None
    for call in calls:
        recorded = agent_step(queue, conversation, tool_calls=[call], tool_names=[HOSTILE_TOOL])
        first = first or recorded
        conversation = [*conversation, _made(call), _result(call["id"])]
    assert first is not None
    steps = list(steps_of(first.trajectory))
    assert len(steps) == len(calls)  # one run
    return steps


def test_a_step_that_looks_the_order_up_again_after_its_result_is_flagged_with_the_first() -> None:
    queue = QueueFactory()
    steps = _run(
        queue,
        [
            _call("call_1", {"order": "4821"}),
            _call("call_2", {"order": "4822"}),  # another order: no loop
            _call("call_3", {"order": "4821"}),  # the first step's call again
            _call("call_4", {"order": "4822"}),  # the second's
        ],
    )

    assert repeated_calls_of(steps) == {
        steps[2].pk: RepeatedCall(HOSTILE_TOOL, first_position=0),
        steps[3].pk: RepeatedCall(HOSTILE_TOOL, first_position=1),
    }
    assert repeated_calls_of(steps)[steps[2].pk].text == (
        f"Repeats step 1's call to {HOSTILE_TOOL} with the same arguments, whose result the "
        "run already had: a loop."
    )


def test_a_call_the_run_began_with_answered_counts_and_one_still_waiting_does_not() -> None:
    queue = QueueFactory()
    began = [GOAL, _made(_call("call_0", {"order": "4821"})), _result("call_0")]
    again = agent_step(
        queue, began, tool_calls=[_call("call_1", {"order": "4821"})], tool_names=[HOSTILE_TOOL]
    )
    waiting = [GOAL, _made(_call("call_9", {"order": "4821"}))]  # its result never sent
    other = agent_step(
        queue, waiting, tool_calls=[_call("call_5", {"order": "4821"})], tool_names=[HOSTILE_TOOL]
    )

    assert repeated_calls_of(list(steps_of(again.trajectory))) == {
        again.step.pk: RepeatedCall(HOSTILE_TOOL, first_position=None)
    }
    assert repeated_calls_of(list(steps_of(other.trajectory))) == {}


def test_the_page_flags_the_loop_escaped_and_links_to_the_first_call() -> None:
    reviewer = UserFactory()
    queue = QueueFactory(members=[reviewer])
    steps = _run(queue, [_call("call_1", {"order": "4821"}), _call("call_2", {"order": "4821"})])
    client = Client()
    client.force_login(reviewer)

    page = client.get(f"/q/{queue.slug}/trajectories/{steps[0].trajectory_id}/").content.decode()

    assert page.count("whose result the run already had: a loop.") == 1
    assert 'id="step-1-repeats"><a href="#step-0">Repeats step 1&#x27;s call to ' in page
    assert "<script>alert(1)</script>" not in page
    assert "look&lt;script&gt;alert(1)&lt;/script&gt;" in page
