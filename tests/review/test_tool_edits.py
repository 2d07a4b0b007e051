"""A reviewer edits a tool call as fields checked against the tool's JSON schema: the tool is
one the call offered, each argument typed as its schema says; a bad value is refused with a
message naming the field and nothing is saved; the edit is a step example with its calls
(for an agent's captured step, its preferred action, the served call its rejected rival)."""

import json
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.test import Client

from icrlhf.gateway.capture import call_capture
from icrlhf.gateway.models import Call
from icrlhf.generation.models import Candidate
from icrlhf.integrations.text_checks import unstorable_text
from icrlhf.memory.models import Example
from icrlhf.queues.models import Item
from icrlhf.review.models import Decision
from icrlhf.review.templatetags.markup import json_fields, json_pretty
from icrlhf.review.tool_edits import argument_fields, tool_calls_edited
from icrlhf.trajectories.models import Step
from tests.factories import GenerationFactory, ItemFactory, agent_step

pytestmark = pytest.mark.django_db

REFUND = {
    "type": "function",
    "function": {
        "name": "refund",
        "description": "Refund an order.",
        "parameters": {
            "type": "object",
            "properties": {
                "order_id": {"type": "string", "description": "The order's number."},
                "amount": {"type": "number", "minimum": 0},
                "reason": {"type": "string", "enum": ["damaged", "lost"]},
                "notify": {"type": "boolean"},
                "items": {"type": "array", "items": {"type": "integer"}},
            },
            "required": ["order_id", "amount"],
        },
    },
}
ESCALATE = {
    "type": "function",
    "function": {
        "name": "escalate",
        "parameters": {
            "type": "object",
            "properties": {"order_id": {"type": "string"}},
            "required": ["order_id"],
        },
    },
}
OPTIONS = {"tools": [REFUND, ESCALATE]}
CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "refund", "arguments": '{"order_id": "4821", "amount": 20}'},
}


def _fields(candidate_id: int, tool: str = "refund", **arguments: str) -> dict[str, str]:
    """What the editor posts once the reviewer has changed a field."""
    return {
        f"toolcall_{candidate_id}_touched": "1",
        f"toolcall_{candidate_id}_0_name": tool,
        **{f"toolcall_{candidate_id}_0_{tool}__{k}": v for k, v in arguments.items()},
    }


def test_each_argument_is_a_field_of_the_kind_its_schema_says() -> None:
    fields = {f.name: f for f in argument_fields(REFUND["function"]["parameters"])}
    assert {name: f.kind for name, f in fields.items()} == {
        "order_id": "string",
        "amount": "number",
        "reason": "choice",
        "notify": "boolean",
        "items": "json",
    }
    assert fields["reason"].choices == ("damaged", "lost")
    assert fields["order_id"].required and not fields["notify"].required


def test_fields_become_a_call_checked_against_the_schema() -> None:
    edited = tool_calls_edited(
        data=_fields(
            7, order_id="4821", amount="12.5", reason="lost", notify="true", items="[1, 2]"
        ),
        candidate_id=7,
        original=[CALL],
        call_options=OPTIONS,
    )
    assert edited is not None
    assert edited[0]["id"] == "call_1" and edited[0]["function"]["name"] == "refund"
    assert json.loads(edited[0]["function"]["arguments"]) == {
        "order_id": "4821",
        "amount": 12.5,
        "reason": "lost",
        "notify": True,
        "items": [1, 2],
    }
    other = tool_calls_edited(
        data=_fields(7, tool="escalate", order_id="4821"),
        candidate_id=7,
        original=[CALL],
        call_options=OPTIONS,
    )
    assert other is not None and other[0]["function"]["name"] == "escalate"
    # Fields the reviewer did not touch are a pick as it is, whatever they hold.
    untouched = {**_fields(7, order_id=" 4821 "), "toolcall_7_touched": "0"}
    assert (
        tool_calls_edited(data=untouched, candidate_id=7, original=[CALL], call_options=OPTIONS)
        is None
    )


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (_fields(7, order_id="4821", amount="twenty"), "refund: amount must be a number"),
        (_fields(7, order_id="4821", amount="nan"), "refund: amount must be a number"),
        (_fields(7, order_id="4821", amount="-3"), "refund: amount: -3.0 is less than the minimum"),
        (_fields(7, order_id="4821"), "refund: 'amount' is a required property"),
        (_fields(7, order_id="1", amount="1", items="[1,"), "refund: items must be JSON"),
        (_fields(7, tool="delete_everything"), "choose one of the tools the call offered"),
    ],
)
def test_a_value_the_schema_refuses_is_named(fields: dict[str, str], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        tool_calls_edited(data=fields, candidate_id=7, original=[CALL], call_options=OPTIONS)


@pytest.fixture
def tool_item(queue: Any) -> tuple[Item, Candidate]:
    item = ItemFactory(
        queue=queue,
        source="gateway",
        status="ready",
        input_text="Order 4821 arrived broken.",
        conversation=[{"role": "user", "content": "Order 4821 arrived broken."}],
        call_options=OPTIONS,
    )
    generation = GenerationFactory(item=item, n_candidates=1)
    candidate = Candidate.objects.create(
        generation=generation, position=0, status="done", text="", tool_calls=[CALL]
    )
    return item, candidate


def test_the_workbench_edits_a_tool_call_as_fields_and_memory_keeps_the_edit(
    logged_in: Client, tool_item: tuple[Item, Candidate]
) -> None:
    item, candidate = tool_item
    page = logged_in.get(f"/items/{item.pk}/").content.decode()
    name_field = f"toolcall_{candidate.pk}_0_name"
    assert f'<select id="{name_field}" name="{name_field}" class="tool-choice">' in page
    assert f'name="toolcall_{candidate.pk}_0_refund__order_id" value="4821"' in page
    assert f'name="toolcall_{candidate.pk}_0_refund__amount" value="20"' in page

    refused = logged_in.post(
        f"/items/{item.pk}/decide/",
        {"choice": f"c{candidate.pk}", **_fields(candidate.pk, order_id="4821", amount="x")},
        follow=True,
    )
    assert "refund: amount must be a number" in refused.content.decode()
    assert not Decision.objects.exists()

    form = _fields(candidate.pk, tool="escalate", order_id="4821")
    logged_in.post(f"/items/{item.pk}/decide/", {"choice": f"c{candidate.pk}", **form})
    decision = Decision.objects.get()
    assert decision.verdict == "edited"
    assert decision.final_tool_calls[0]["function"] == {
        "name": "escalate",
        "arguments": '{"order_id": "4821"}',
    }
    preferred = Example.objects.get(decision=decision, role="preferred")
    assert preferred.turns[-1]["tool_calls"][0]["function"]["name"] == "escalate"
    assert Example.objects.get(decision=decision, role="rejected").output_text.startswith("refund(")


def test_unchanged_fields_are_a_pick(logged_in: Client, tool_item: tuple[Item, Candidate]) -> None:
    item, candidate = tool_item
    form = _fields(candidate.pk, order_id="4821", amount="20")
    logged_in.post(f"/items/{item.pk}/decide/", {"choice": f"c{candidate.pk}", **form})
    decision = Decision.objects.get()
    assert decision.verdict == "chosen" and decision.final_tool_calls == []


@pytest.mark.parametrize(
    "parameters",
    [
        {"type": "object", "properties": ["order_id"]},
        {"type": "object", "properties": {"a": {"type": "string"}}, "required": True},
        {"type": "object", "properties": {"a": {"type": "strin"}}},
        {"type": "object", "properties": {"a": {"type": "string", "pattern": "("}}},
        {"$ref": "http://169.254.169.254/latest/meta-data"},
    ],
)
def test_a_schema_the_editor_cannot_use_is_refused_in_words_and_nothing_is_fetched(
    parameters: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    fetched: list[Any] = []
    monkeypatch.setattr("urllib.request.urlopen", lambda *a, **k: fetched.append(a))
    options = {
        "tools": [{"type": "function", "function": {"name": "odd", "parameters": parameters}}]
    }
    odd_call = {"id": "c", "type": "function", "function": {"name": "odd", "arguments": "{}"}}
    data = {"toolcall_7_touched": "1", "toolcall_7_0_name": "odd", "toolcall_7_0_odd__a": "x"}
    with pytest.raises(ValidationError, match="odd: "):  # a message, never an error page
        tool_calls_edited(data=data, candidate_id=7, original=[odd_call], call_options=options)
    assert fetched == []


def test_an_item_whose_tool_schema_is_unusable_still_opens_without_the_editor(
    logged_in: Client, queue: Any
) -> None:
    odd = {"type": "function", "function": {"name": "odd", "parameters": {"properties": [1]}}}
    item = ItemFactory(queue=queue, source="gateway", status="ready", call_options={"tools": [odd]})
    generation = GenerationFactory(item=item, n_candidates=1)
    call = {"id": "c", "type": "function", "function": {"name": "odd", "arguments": "{}"}}
    candidate = Candidate.objects.create(
        generation=generation, position=0, status="done", text="", tool_calls=[call]
    )
    page = logged_in.get(f"/items/{item.pk}/")
    assert page.status_code == 200 and b"tool-choice" not in page.content
    # Picked as it is (the fields were never there), it is a pick.
    logged_in.post(f"/items/{item.pk}/decide/", {"choice": f"c{candidate.pk}"})
    assert Decision.objects.get().verdict == "chosen"


def test_an_agent_steps_edited_call_is_preferred_and_the_served_call_its_rejected_rival(
    logged_in: Client, queue: Any
) -> None:
    """An agent's step the application rewarded below the bar, captured from the gateway as it
    was: the reviewer's edit of its call is the step's preferred example, and the call the
    application was served its rejected rival with the application's reward, as a correction
    posted to the feedback API is."""
    goal = {"role": "user", "content": "Order 4821 never arrived."}
    call = Call.objects.create(
        queue=queue,
        source="model",
        memory="used",
        request_text=goal["content"],
        context=[goal],
        options=OPTIONS,
        tool_calls=[CALL],
        capture=Call.Capture.LOW_REWARD,
        request_hash="c" * 64,
    )
    step = agent_step(
        queue, [goal], tool_calls=[CALL], tool_names=["escalate", "refund"], call_id=call.pk
    ).step
    Step.objects.filter(pk=step.pk).update(reward=0.2)
    item = call_capture(call_id=call.pk)
    assert item is not None
    served = Candidate.objects.get(generation__item=item, served=True)

    # Ready, as the worker leaves it once the other candidates are written (none here).
    Item.objects.filter(pk=item.pk).update(status=Item.Status.READY)

    form = _fields(served.pk, tool="escalate", order_id="4821")
    logged_in.post(f"/items/{item.pk}/decide/", {"choice": f"c{served.pk}", **form})
    decision = Decision.objects.get()
    preferred = Example.objects.get(decision=decision, role="preferred")
    rejected = Example.objects.get(decision=decision, role="rejected")
    assert (decision.verdict, preferred.reward, rejected.reward) == ("edited", 1.0, 0.2)
    assert preferred.tool_names == rejected.tool_names == ["escalate", "refund"]
    assert preferred.turns == [
        goal,
        {"role": "assistant", "content": None, "tool_calls": decision.final_tool_calls},
    ]
    assert preferred.output_text == 'escalate({"order_id": "4821"})'
    assert rejected.turns[-1]["tool_calls"] == [CALL] and rejected.candidate_id == served.pk


@pytest.mark.parametrize("items", ["[" * 100_000, "[NaN]"], ids=["nested 100,000 deep", "NaN"])
def test_a_json_value_that_is_not_standard_json_within_bounds_is_named(items: str) -> None:
    fields = _fields(7, order_id="4821", amount="1", items=items)
    with pytest.raises(ValidationError, match="refund: items must be JSON"):
        tool_calls_edited(data=fields, candidate_id=7, original=[CALL], call_options=OPTIONS)


def test_an_escaped_lone_surrogate_kept_from_the_model_stays_an_escape() -> None:
    # An argument the schema does not list is kept as the model wrote it: here an escape
    # that, read as JSON, is a lone surrogate, which neither database stores.
    arguments = '{"order_id": "4821", "amount": 20, "note": "\\ud800 ok"}'
    original = [{**CALL, "function": {"name": "refund", "arguments": arguments}}]

    edited = tool_calls_edited(
        data=_fields(7, order_id="4821", amount="12"),
        candidate_id=7,
        original=original,
        call_options=OPTIONS,
    )

    assert edited is not None
    written = edited[0]["function"]["arguments"]
    assert unstorable_text(written) is None
    assert json.loads(written)["note"] == "\ud800 ok"


def test_the_editor_and_the_call_list_show_arguments_they_cannot_read_as_sent() -> None:
    deep = "[" * 100_000
    assert json_fields(deep) is None
    assert json_pretty(deep) == deep
    shown = json_fields('{"\\ud800": "\\udfff", "to": "café"}')
    assert shown == [("\ufffd", '"\\udfff"'), ("to", '"café"')]
    for name, value in shown or []:
        (name + value).encode()  # a page is sent as UTF-8
