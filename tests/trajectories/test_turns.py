from icrlhf.memory.signatures import action_message as answer_message
from icrlhf.trajectories.turns import action_message

CALL = {"id": "call_0", "type": "function", "function": {"name": "look_up", "arguments": "{}"}}


def test_a_steps_action_carries_no_words_beside_its_tool_calls() -> None:
    """A step keeps none (step_record); an answer the gateway sends keeps the model's."""
    assert action_message(text="Looking.", tool_calls=[CALL]) == {
        "role": "assistant",
        "content": None,
        "tool_calls": [CALL],
    }
    assert answer_message("Looking.", [CALL])["content"] == "Looking."
    assert answer_message("", [CALL])["content"] is None
    assert action_message(text="Done.", tool_calls=[]) == answer_message("Done.", [])
