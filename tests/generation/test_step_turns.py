"""A stored step in the prompt: every call answered, as OpenAI requires, and no result invented
that the model could copy to the caller (a small model answered a customer with the
placeholder "(result not recorded)")."""

import json
from typing import Any

from icrlhf.generation.prompts import PromptExample, messages_build


def _call(call_id: str, order: str) -> dict[str, Any]:
    arguments = json.dumps({"order": order})
    return {"id": call_id, "type": "function", "function": {"name": "look", "arguments": arguments}}


def _prompt(*examples: PromptExample) -> list[dict[str, Any]]:
    return messages_build(
        system_prompt="Be helpful.",
        playbook="",
        playbook_version=None,
        examples=examples,
        request="Where is order 14?",
    )


def _every_call_answered_before_the_next_turn(messages: list[dict[str, Any]]) -> bool:
    """OpenAI's rule: an assistant's tool calls are followed by a tool message for each."""
    for index, message in enumerate(messages):
        calls = {call["id"] for call in message.get("tool_calls") or []}
        following = []
        for after in messages[index + 1 :]:
            if after["role"] != "tool":
                break
            following.append(after["tool_call_id"])
        if calls and set(following) != calls:
            return False
    return True


def test_a_steps_action_without_its_result_ends_the_example_with_an_empty_result() -> None:
    action = {"role": "assistant", "content": None, "tool_calls": [_call("call_0", "13")]}
    step = PromptExample(
        "Where is order 13?", "look", ({"role": "user", "content": "Where is order 13?"}, action)
    )

    messages = _prompt(step)

    assert messages[1:] == [
        {"role": "user", "content": "Where is order 13?"},
        {**action, "tool_calls": [{**_call("call_0", "13"), "id": "example1_call_0"}]},
        {"role": "tool", "tool_call_id": "example1_call_0", "content": ""},
        {"role": "user", "content": "Where is order 14?"},
    ]
    assert "not recorded" not in json.dumps(messages)


def test_only_the_calls_left_unanswered_get_an_empty_result_the_stored_ones_are_kept() -> None:
    """Parallel calls with one result stored; and a call in the step's past whose result the
    caller never sent, followed by the step's own action."""
    parallel = {
        "role": "assistant",
        "content": None,
        "tool_calls": [_call("call_1", "21"), _call("call_2", "22")],
    }
    step = PromptExample(
        "Orders 21 and 22?",
        "look",
        (
            {"role": "user", "content": "Orders 21 and 22?"},
            parallel,
            {"role": "tool", "tool_call_id": "call_1", "content": "21 shipped"},
            {"role": "user", "content": "And 23?"},
            {"role": "assistant", "content": None, "tool_calls": [_call("call_3", "23")]},
            {"role": "tool", "tool_call_id": "call_3", "content": "23 lost"},
        ),
    )

    messages = _prompt(step)

    results = {m["tool_call_id"]: m["content"] for m in messages if m["role"] == "tool"}
    assert results == {
        "example1_call_1": "21 shipped",
        "example1_call_2": "",
        "example1_call_3": "23 lost",
    }
    assert _every_call_answered_before_the_next_turn(messages)
    roles = [m["role"] for m in messages]
    assert roles == ["system", "user", "assistant", "tool", "tool", "user", "assistant", "tool"] + [
        "user"
    ]
