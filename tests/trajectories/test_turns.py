from icrlhf.memory.signatures import action_message
from icrlhf.trajectories.turns import step_message

CALL = {"id": "call_0", "type": "function", "function": {"name": "look_up", "arguments": "{}"}}


def test_a_steps_action_carries_no_words_beside_its_tool_calls() -> None:
    """A step keeps none (step_record); an answer the gateway sends keeps the model's."""
    assert step_message(text="Looking.", tool_calls=[CALL]) == {
        "role": "assistant",
        "content": None,
        "tool_calls": [CALL],
    }
    assert action_message("Looking.", [CALL])["content"] == "Looking."
    assert action_message("", [CALL])["content"] is None
    assert step_message(text="Done.", tool_calls=[]) == action_message("Done.", [])
