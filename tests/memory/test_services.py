"""Where examples are written (memory/services.py): what a decision teaches, with its rewards
(ratings on memory's scale), an agent's step with its signature and turns, indexing sent once
the decision commits, and an undone decision's examples withdrawn with an audit event."""

import json
from typing import Any

import pytest

from icrlhf.memory import services
from icrlhf.memory.models import CurationEvent, Example
from icrlhf.memory.services import ExampleDraft
from tests.factories import DecisionFactory, ItemFactory, QueueFactory, ready_generation

pytestmark = pytest.mark.django_db


def test_ratings_become_rewards_from_0_to_1() -> None:
    assert [services.rating_reward(r) for r in services.RATINGS] == [0.0, 0.25, 0.5, 0.75, 1.0]


def decided(queue: Any) -> Any:
    item = ItemFactory(queue=queue, input_text="Where is my card?")
    return DecisionFactory(item=item, generation=ready_generation(item, ["a", "b", "c"]))


def test_a_decision_teaches_its_pick_and_its_rejections_indexed_after_commit(
    django_capture_on_commit_callbacks: Any,
) -> None:
    queue = QueueFactory()
    decision = decided(queue)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        examples = services.examples_record(
            decision_id=decision.pk,
            queue_id=queue.pk,
            input_text="Where is my card?",
            preferred=ExampleDraft(candidate_id=None, output_text="It ships in 3 days."),
            rejected=[
                ExampleDraft(candidate_id=None, output_text="No idea."),
                ExampleDraft(candidate_id=None, output_text="Ask later.", reward=0.25),
            ],
        )
    assert [(e.role, e.output_text, e.reward) for e in examples] == [
        (Example.Role.PREFERRED, "It ships in 3 days.", 1.0),
        (Example.Role.REJECTED, "No idea.", 0.0),
        (Example.Role.REJECTED, "Ask later.", 0.25),  # the reviewer's rating wins
    ]
    assert {e.index_state for e in Example.objects.all()} == {Example.IndexState.PENDING}
    assert len(callbacks) == 1  # one indexing task for all of them, after the commit


def test_an_agents_step_keeps_its_tools_and_turns() -> None:
    queue = QueueFactory()
    decision = decided(queue)
    tools = [{"type": "function", "function": {"name": "track", "parameters": {}}}]
    call = {"id": "c", "type": "function", "function": {"name": "track", "arguments": "{}"}}
    (example,) = services.examples_record(
        decision_id=decision.pk,
        queue_id=queue.pk,
        input_text="Where is my card?",
        preferred=ExampleDraft(candidate_id=None, output_text="", tool_calls=[call]),
        rejected=[],
        conversation=[
            {"role": "system", "content": "The caller's own rules."},
            {"role": "user", "content": "Where is my card?"},
        ],
        call_options={"tools": tools},
    )
    assert example.tool_names == ["track"]
    # The caller's system message is the queue's business, never an example's turn.
    assert [t["role"] for t in example.turns] == ["user", "assistant"]
    assert example.turns[-1]["tool_calls"][0]["function"]["name"] == "track"
    assert example.output_text == "track({})"  # the call as one text, for prompts and exports


def test_an_undone_decisions_examples_are_retired_with_a_reason() -> None:
    queue = QueueFactory()
    decision = decided(queue)
    services.examples_record(
        decision_id=decision.pk,
        queue_id=queue.pk,
        input_text="Where is my card?",
        preferred=ExampleDraft(candidate_id=None, output_text="It ships in 3 days."),
        rejected=[],
    )
    services.examples_withdraw(decision_id=decision.pk, actor=None)
    example = Example.objects.get()
    assert example.status == Example.Status.RETIRED
    event = CurationEvent.objects.get(example_id=example.pk)
    assert f"decision {decision.pk} was undone" in json.dumps(event.detail)
