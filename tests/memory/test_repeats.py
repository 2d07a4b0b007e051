"""A call made again after its result came back is a loop: memory never teaches one."""

import json
from typing import Any

from icrlhf.memory.models import Example
from icrlhf.memory.repeats import CallKey, answered_calls, teaches_a_loop, without_repeats
from icrlhf.memory.selectors import RetrievedExample

ASKED = {"role": "user", "content": "Where is order 1234?"}


def _call(call_id: str, arguments: Any, name: str = "look_up_order") -> dict[str, Any]:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": text}}


def _made(*calls: dict[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": list(calls)}


def _result(call_id: str, text: str = "Shipped on Monday.") -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def _hit(turns: list[dict[str, Any]], rank: int, output_text: str = "") -> RetrievedExample:
    return RetrievedExample(
        example=Example(input_text="x", output_text=output_text, turns=turns),
        score=0.9,
        rank=rank,
    )


LOOKED_UP = [ASKED, _made(_call("call_0", {"order": "1234"})), _result("call_0")]


def test_the_same_arguments_are_the_same_call_whatever_their_order_and_spacing() -> None:
    assert CallKey.of(_call("a", '{"order": "1234", "full": true}')) == CallKey.of(
        _call("b", '{"full":true,"order":"1234"}')
    )
    assert CallKey.of(_call("a", {"order": "1234"})) != CallKey.of(_call("a", {"order": "1235"}))
    assert CallKey.of(_call("a", {"order": "1234"})) != CallKey.of(
        _call("a", {"order": "1234"}, name="refund")
    )
    # Arguments that are not JSON compare as the text sent.
    assert CallKey.of(_call("a", "order 1234 ")) == CallKey.of(_call("b", "order 1234"))


def test_only_a_call_whose_result_came_back_counts_as_answered() -> None:
    waiting = [ASKED, _made(_call("call_0", {"order": "1234"}))]
    assert answered_calls(waiting) == {}
    assert answered_calls(LOOKED_UP) == {CallKey.of(_call("x", {"order": "1234"})): 1}


def test_a_result_answers_the_latest_call_with_its_id_when_an_agent_reuses_ids() -> None:
    conversation = [
        ASKED,
        _made(_call("call_0", {"order": "1234"})),
        _result("call_0"),
        _made(_call("call_0", {"order": "9999"})),
    ]
    assert set(answered_calls(conversation)) == {CallKey.of(_call("x", {"order": "1234"}))}


def test_a_step_that_looks_the_order_up_again_after_its_result_is_not_retrieved() -> None:
    again = _hit([*LOOKED_UP[:1], _made(_call("call_7", '{"order":"1234"}'))], rank=1)
    other_order = _hit([ASKED, _made(_call("call_3", {"order": "1235"}))], rank=2)
    plain = _hit([], rank=3, output_text="It shipped on Monday.")

    kept = without_repeats(LOOKED_UP, [again, other_order, plain])

    assert [hit.example for hit in kept] == [other_order.example, plain.example]
    assert [hit.rank for hit in kept] == [1, 2]  # ranked again, in the order retrieved


def test_before_the_result_comes_back_the_same_call_is_still_taught() -> None:
    waiting = [ASKED, _made(_call("call_0", {"order": "1234"}))]
    first_lookup = _hit([ASKED, _made(_call("call_7", {"order": "1234"}))], rank=1)
    assert without_repeats(waiting, [first_lookup]) == [first_lookup]
    assert without_repeats([ASKED], [first_lookup]) == [first_lookup]


def test_a_step_whose_own_turns_show_the_loop_is_taught_to_no_one() -> None:
    loop = [*LOOKED_UP, _made(_call("call_1", {"order": "1234"})), _result("call_1")]
    assert teaches_a_loop(loop)
    assert without_repeats([ASKED], [_hit(loop, rank=1)]) == []
    # Its results stored after its action change nothing; a new call after a result does.
    onwards = [*LOOKED_UP, _made(_call("call_1", {"order": "1234"}, name="refund"))]
    assert not teaches_a_loop(onwards)
    assert not teaches_a_loop([ASKED, {"role": "assistant", "content": "Hello."}])
    assert not teaches_a_loop([])


def test_one_repeated_call_among_parallel_ones_is_enough_to_leave_a_step_out() -> None:
    both = _made(_call("call_5", {"order": "1234"}), _call("call_6", {"order": "77"}))
    assert without_repeats(LOOKED_UP, [_hit([ASKED, both], rank=1)]) == []


def test_arguments_nested_deeper_than_json_is_read_compare_as_text() -> None:
    deep = "[" * 100_000
    conversation = [ASKED, _made(_call("call_0", deep)), _result("call_0")]

    assert answered_calls(conversation) == {CallKey.of(_call("x", deep)): 1}
    assert teaches_a_loop([*conversation, _made(_call("call_1", deep))])
    assert CallKey.of(_call("a", deep)) != CallKey.of(_call("a", "[" * 99_999))
