"""Tool calls a model wrote as text (Qwen2.5-Coder fences them in ```json): read as calls only
when the whole answer is calls of offered tools; anything else stays the model's words."""

import json

import pytest

from icrlhf.integrations.text_tool_calls import calls_in_text, could_become_calls, offered_tools

OFFERED = frozenset({"get_weather", "get_time"})
WEATHER = '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}'


def _named(calls: tuple[dict[str, object], ...]) -> list[tuple[object, object]]:
    return [
        (call["function"]["name"], json.loads(call["function"]["arguments"]))  # type: ignore[index]
        for call in calls
    ]


@pytest.mark.parametrize(
    "text",
    [
        WEATHER,
        f"```json\n{WEATHER}\n```",  # Qwen2.5-Coder's own way
        f"  ```\n{WEATHER}\n```  ",
        f"<tool_call>\n{WEATHER}\n</tool_call>",
        f"[{WEATHER}]",
        '{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\", \\"unit\\": \\"c\\"}"}',
        '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "c"}}',
    ],
)
def test_an_answer_of_one_call_is_read_as_that_call(text: str) -> None:
    calls = calls_in_text(text, OFFERED)
    assert _named(calls) == [("get_weather", {"city": "Paris", "unit": "c"})]
    assert calls[0]["type"] == "function" and str(calls[0]["id"]).startswith("call_")


def test_several_calls_are_read_in_order_from_blocks_lines_or_a_list() -> None:
    time = '{"name": "get_time", "arguments": {"city": "Tokyo"}}'
    expected = [("get_weather", {"city": "Paris", "unit": "c"}), ("get_time", {"city": "Tokyo"})]
    for text in (
        f"```json\n{WEATHER}\n```\n```json\n{time}\n```",
        f"{WEATHER}\n{time}",
        f"[{WEATHER}, {time}]",
    ):
        assert _named(calls_in_text(text, OFFERED)) == expected
    ids = {call["id"] for call in calls_in_text(f"{WEATHER}\n{WEATHER}", OFFERED)}
    assert len(ids) == 2


@pytest.mark.parametrize(
    "text",
    [
        "It is sunny in Paris.",
        f"Here is the call:\n```json\n{WEATHER}\n```",  # words around it: the model's words
        '{"name": "cat joke", "arguments": {"cat": "Meow"}}',  # no such tool offered
        '{"name": "get_weather", "arguments": ["Paris"]}',  # arguments not an object
        '{"name": "get_weather", "arguments": "Paris"}',
        '{"name": "get_weather"}',
        '{"city": "Paris"}',  # an answer in JSON, not a call
        f"{WEATHER}\nand that's it",
        '{"name": "get_weather", "arguments": {"days": NaN}}',  # not standard JSON
        "```python\nprint('hi')\n```",
        "",
    ],
)
def test_anything_but_calls_of_offered_tools_stays_words(text: str) -> None:
    assert calls_in_text(text, OFFERED) == ()


def test_no_tools_offered_or_tool_choice_none_reads_nothing() -> None:
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    assert offered_tools({"tools": tools}) == {"get_weather"}
    assert offered_tools({"tools": tools, "tool_choice": "none"}) == frozenset()
    assert offered_tools({"tools": "not a list"}) == frozenset()
    assert offered_tools(None) == frozenset()
    assert calls_in_text(WEATHER, frozenset()) == ()


@pytest.mark.parametrize(
    ("begun", "may_be_calls"),
    [
        ("", True),
        ("  ", True),
        ("`", True),
        ("```", True),
        ("```js", True),  # the language is not known until its line ends
        ("```json\n{", True),
        ("```\n", True),
        ("```python\n", False),
        ("<tool", True),
        ("<tool_call>\n{", True),
        ('{"name"', True),
        ("[", True),
        ("It", False),
        ("<b>", False),
    ],
)
def test_a_stream_is_held_back_only_while_it_may_still_be_calls(
    begun: str, may_be_calls: bool
) -> None:
    assert could_become_calls(begun) is may_be_calls
