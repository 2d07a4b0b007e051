"""Which stored steps a request may be shown: the tools it offers, the format it requires."""

from icrlhf.memory.signatures import PLAIN, Signature, action_text

SEARCH = {"type": "function", "function": {"name": "search", "parameters": {}}}
REFUND = {"type": "function", "function": {"name": "refund", "parameters": {}}}
SCHEMA = {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object"}}}


def test_an_example_is_offered_only_with_every_tool_it_was_made_with() -> None:
    both = Signature.of(tools=[SEARCH, REFUND], response_format=None)
    only_search = Signature.of(tools=[SEARCH], response_format=None)
    made_with_refund = {"tool_names": ["refund", "search"], "output_format": {}}
    assert both.admits(**made_with_refund)
    assert not only_search.admits(**made_with_refund)
    assert not PLAIN.admits(**made_with_refund)
    assert only_search.admits(tool_names=[], output_format={})  # a plain answer may help


def test_an_example_is_offered_only_where_its_output_format_is_required() -> None:
    structured = Signature.of(tools=None, response_format=SCHEMA)
    assert structured.admits(tool_names=[], output_format=SCHEMA)
    assert not structured.admits(tool_names=[], output_format={})  # text where a schema is due
    assert not PLAIN.admits(tool_names=[], output_format=SCHEMA)
    other = {**SCHEMA, "json_schema": {"name": "b", "schema": {"type": "object"}}}
    assert not structured.admits(tool_names=[], output_format=other)
    assert Signature.of(tools=None, response_format={"type": "text"}) == PLAIN


def test_after_a_tool_result_only_agent_steps_are_offered() -> None:
    after = Signature.of(tools=[SEARCH], response_format=None, after_tool_result=True)
    assert not after.admits(tool_names=[], output_format={})
    assert after.admits(tool_names=["search"], output_format={})


def test_a_signature_survives_the_trip_to_the_stores_owner() -> None:
    signature = Signature.of(tools=[SEARCH], response_format=SCHEMA, after_tool_result=True)
    assert Signature.from_json(signature.as_json()) == signature


def test_an_action_reads_as_its_words_then_its_calls() -> None:
    call = {"id": "c", "type": "function", "function": {"name": "search", "arguments": "{}"}}
    assert action_text("Looking.", [call]) == "Looking.\nsearch({})"
    assert action_text("Done.", []) == "Done."
