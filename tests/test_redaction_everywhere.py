"""One redaction on every way end users' words go into storage: the gateway's log, a capture
by share and by low reward, the agent's step, the reward rule, a review decision, and the two
exports. An e-mail address and a card number, in a message, a tool call's arguments and a
tool's result, never pass unredacted where the REDACTION mode promises it:

- "all": nowhere at all;
- "captured" (the default): nowhere in review, memory or an export; the call log and its
  steps keep a call nobody captured as it was sent, until retention purges it.

The upstream model is litellm's own offline switch (`mock_response`, `mock_tool_calls`): a
unit-test double on litellm's real code path."""

import json
from collections.abc import Callable
from typing import Any

import pytest
from django.db.models import Model
from django.test import Client, override_settings

from icrlhf.export.selectors import ExportFilters
from icrlhf.export.services import export_lines
from icrlhf.export.trajectories import TrajectoryFilters, trajectory_export_lines
from icrlhf.gateway import tasks as gateway_tasks
from icrlhf.gateway.models import Call
from icrlhf.generation.models import Candidate, Generation
from icrlhf.ingest.services import token_create
from icrlhf.integrations import llm
from icrlhf.memory.models import Example
from icrlhf.queues.models import Item
from icrlhf.review.decisions import decision_record
from icrlhf.review.models import Decision
from icrlhf.trajectories.models import Feedback, Step, Trajectory
from tests.factories import QueueFactory, UserFactory
from tests.support.waiting import wait_for

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.urls("icrlhf.gateway.urls"),
    pytest.mark.usefixtures("eager_tasks", "vector_store", "gateway_threads"),
]

EMAIL = "jane.doe@example.com"
CARD = "4111 1111 1111 1111"
PERSONAL = (EMAIL, CARD, CARD.replace(" ", ""))
LOOKUP = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "lookup_order", "arguments": json.dumps({"email": EMAIL})},
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{name} for an order",
            "parameters": {"type": "object", "properties": {"note": {"type": "string"}}},
        },
    }
    for name in ("lookup_order", "refund")
]
# What the model answers: a call whose arguments repeat the end user's data, compact JSON.
REFUND = {
    "id": "call_2",
    "type": "function",
    "function": {
        "name": "refund",
        "arguments": json.dumps({"note": f"to {CARD} for {EMAIL}"}, separators=(",", ":")),
    },
}


def conversation(opening: str) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": f"{opening} I am {EMAIL}, card {CARD}; order 4821 broke."},
        {"role": "assistant", "content": None, "tool_calls": [LOOKUP]},
        {
            "role": "tool",
            "tool_call_id": "call_1",
            "content": json.dumps({"card": CARD, "email": EMAIL}, separators=(",", ":")),
        },
    ]


@pytest.fixture
def model_calls_refund(monkeypatch: pytest.MonkeyPatch) -> None:
    """Test double: a model that repeats what it was given. Shown the end user's data (the
    gateway's call), it answers REFUND; shown placeholders (review's candidates), text."""
    real = {name: getattr(llm, name) for name in ("acomplete", "acomplete_n", "complete")}

    def double(name: str) -> Callable[..., Any]:
        def shown(kwargs: dict[str, Any]) -> dict[str, Any]:
            if EMAIL not in json.dumps(kwargs.get("messages")):
                return {"mock_response": "Sorry, I will look into it."}
            options = {**(kwargs.get("options") or {}), "mock_tool_calls": [REFUND]}
            return {"mock_response": "", "options": options}

        if name == "complete":
            return lambda **kwargs: real[name](**{**kwargs, **shown(kwargs)})

        async def answer(**kwargs: Any) -> Any:
            return await real[name](**{**kwargs, **shown(kwargs)})

        return answer

    for name in real:
        monkeypatch.setattr(llm, name, double(name))


def call_through_gateway(client: Client, opening: str, run: str) -> Call:
    body = {"model": "helpdesk", "messages": conversation(opening), "tools": TOOLS}
    answer = client.post(
        "/v1/chat/completions",
        json.dumps(body),
        "application/json",
        headers={"X-Icrlhf-Trajectory": run},
    )
    assert answer.status_code == 200, answer.content
    # The caller gets the model's answer whole: redaction is about what is kept.
    assert answer.json()["choices"][0]["message"]["tool_calls"][0]["function"] == REFUND["function"]
    return Call.objects.get(pk=answer["X-Icrlhf-Call"])


def leaks(rows: Any) -> list[str]:
    dumped = json.dumps(rows, default=str, ensure_ascii=False)
    return [each for each in PERSONAL if each in dumped]


def table(model: type[Model], **filters: Any) -> list[dict[str, Any]]:
    return list(model.objects.filter(**filters).values())  # type: ignore[attr-defined]


def exported(lines: Callable[..., Any], fmt: str, filters: Any) -> str:
    return "".join(lines(fmt=fmt, filters=filters, consumer="test"))


@pytest.mark.parametrize("mode", ["captured", "all"])
@pytest.mark.usefixtures("model_calls_refund")
def test_personal_data_never_passes_unredacted_on_any_way_in(mode: str, settings: Any) -> None:
    settings.REDACTION = mode
    queue = QueueFactory(
        slug="helpdesk",
        n_candidates=2,
        capture_percent=100,
        reward_threshold=0.5,
        capture_low_reward=True,
    )
    record, token = token_create(queue=queue, name="app")
    client = Client(headers={"Authorization": f"Bearer {token}"})

    # 1. A call captured by share: the log, the step, the review item.
    sampled = call_through_gateway(client, "Hello.", "run-sampled")
    item = wait_for(
        lambda: Item.objects.filter(calls=sampled.pk, status=Item.Status.READY).first(),
        what="the capture's candidates",
    )
    # 2. A call nobody captured, then rewarded low: captured by the sweep.
    queue.capture_percent = 0
    queue.save()
    low = call_through_gateway(client, "Hi again.", "run-low")
    if mode == "captured":  # the call log keeps an uncaptured call as sent
        assert leaks(table(Call, pk=low.pk)) != []
        assert leaks(table(Step, call_id=low.pk)) != []
    with override_settings(ROOT_URLCONF="icrlhf.urls"):  # the web app's feedback API
        feedback = client.post(
            "/api/v1/feedback",
            json.dumps({"trajectory_id": "run-low", "reward": 0.0, "comment": f"Mail {EMAIL}"}),
            content_type="application/json",
        )
    assert feedback.status_code == 201, feedback.content
    gateway_tasks.captures_sweep()
    low_item = wait_for(
        lambda: Item.objects.filter(calls=low.pk, status=Item.Status.READY).first(),
        what="the low-reward capture's candidates",
    )
    # 3. The reward rule stored the low run's step as a rejected example.
    assert Example.objects.filter(step__call=low.pk, role="rejected").exists()
    # 4. A reviewer picks the served answer of the first capture: a decision, its examples.
    reviewer = UserFactory()
    queue.members.add(reviewer)
    served = Candidate.objects.get(generation__item=item, served=True)
    decision_record(item_id=item.pk, reviewer=reviewer, verdict="chosen", candidate_id=served.pk)

    review_side = {
        "items": table(Item, pk__in=[item.pk, low_item.pk]),
        "generations": table(Generation, item__in=[item.pk, low_item.pk]),
        "candidates": table(Candidate, generation__item__in=[item.pk, low_item.pk]),
        "examples": table(Example, queue=queue),
        "decisions": table(Decision, item=item.pk),
        "captured calls": table(Call, pk__in=[sampled.pk, low.pk]),
        "captured steps": table(Step, call_id__in=[sampled.pk, low.pk]),
    }
    for path, rows in review_side.items():
        assert rows, f"{path}: nothing was stored, so nothing was checked"
        assert leaks(rows) == [], (path, rows)
    assert "[email]" in json.dumps(review_side["examples"], default=str)  # placeholders, not blanks
    # 5. The exports, every format.
    for fmt in ("canonical", "trl", "openai", "kto"):
        assert leaks(exported(export_lines, fmt, ExportFilters(queue=queue))) == [], fmt
    for fmt in ("canonical", "openai", "trl", "pairs"):
        lines = exported(trajectory_export_lines, fmt, TrajectoryFilters(queue=queue))
        assert leaks(lines) == [], fmt
    assert "[card number]" in exported(
        trajectory_export_lines, "canonical", TrajectoryFilters(queue=queue)
    )
    if mode == "all":  # and nothing anywhere
        everything = [
            table(model) for model in (Call, Step, Feedback, Trajectory, Item, Candidate, Example)
        ]
        assert leaks(everything) == []


ADDRESS = "ana@example.com"
# JSON written as text, its escaped lone surrogate beside an address: storable as sent (an
# escape), and once JSON is read a real lone surrogate, which no database stores.
SURROGATE_BESIDE_ADDRESS = '{"a": "\\ud800 ' + ADDRESS + '"}'


def surrogate_conversation() -> list[dict[str, Any]]:
    look_up = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "lookup_order", "arguments": SURROGATE_BESIDE_ADDRESS},
    }
    return [
        {"role": "user", "content": SURROGATE_BESIDE_ADDRESS},
        {"role": "assistant", "content": None, "tool_calls": [look_up]},
        {"role": "tool", "tool_call_id": "call_1", "content": SURROGATE_BESIDE_ADDRESS},
    ]


def downloaded(path: str, *, token: str) -> str:
    """An export as its consumer gets it: streamed, then read as UTF-8."""
    download = Client().get(path, headers={"Authorization": f"Bearer {token}"})
    assert download.status_code == 200, (path, download.content)
    return b"".join(download.streaming_content).decode()  # type: ignore[attr-defined]


def web_client_of(queue: Any) -> Client:
    reviewer = UserFactory()
    queue.members.add(reviewer)
    client = Client()
    client.force_login(reviewer)
    return client


@pytest.mark.parametrize("mode", ["captured", "all"])
def test_an_escaped_lone_surrogate_beside_an_address_is_logged_rewarded_exported_and_shown(
    mode: str, settings: Any, llm_answer: Any
) -> None:
    settings.REDACTION = mode
    llm_answer("I will look into it.")
    queue = QueueFactory(slug="helpdesk", n_candidates=2, capture_percent=100, reward_threshold=0.5)
    _record, token = token_create(queue=queue, name="app")
    client = Client(headers={"Authorization": f"Bearer {token}"})

    def call(run: str) -> Call:
        body = {"model": "helpdesk", "messages": surrogate_conversation(), "tools": TOOLS}
        answer = client.post(
            "/v1/chat/completions",
            json.dumps(body),
            "application/json",
            headers={"X-Icrlhf-Trajectory": run},
        )
        assert answer.status_code == 200, answer.content
        return Call.objects.get(pk=answer["X-Icrlhf-Call"])  # logged

    captured = call("run-captured")
    item = wait_for(
        lambda: Item.objects.filter(calls=captured.pk, status=Item.Status.READY).first(),
        what="the capture's candidates",
    )
    queue.capture_percent = 0  # the next call's words reach memory only by its reward
    queue.save()
    rewarded = call("run-rewarded")
    with override_settings(ROOT_URLCONF="icrlhf.urls"):  # the web app's API and pages
        for run in ("run-captured", "run-rewarded"):
            feedback = client.post(
                "/api/v1/feedback",
                json.dumps({"trajectory_id": run, "reward": 1.0, "success": True}),
                content_type="application/json",
            )
            assert feedback.status_code == 201, feedback.content
        assert Example.objects.filter(step__call=rewarded.pk, role="preferred").exists()
        # The runs' export, downloaded: every format is sent whole, UTF-8, no address in it.
        _record, trainer = token_create(queue=queue, name="trainer", scopes=["export"])
        for fmt in ("canonical", "openai", "trl", "pairs"):
            lines = downloaded(f"/api/v1/exports/trajectories?format={fmt}", token=trainer)
            assert ADDRESS not in lines, fmt
            assert fmt == "pairs" or len(lines.splitlines()) == 2, fmt  # both runs succeeded
            assert fmt != "canonical" or "[email]" in lines
        reviewer = web_client_of(queue)
        for logged in (captured, rewarded):
            run = Step.objects.get(call=logged.pk).trajectory
            page = reviewer.get(f"/q/{queue.slug}/trajectories/{run.pk}/")
            assert page.status_code == 200, page.content[-2000:]
        assert reviewer.get(f"/items/{item.pk}/").status_code == 200
    served = Candidate.objects.get(generation__item=item, served=True)
    decision_record(
        item_id=item.pk, reviewer=UserFactory(), verdict="chosen", candidate_id=served.pk
    )

    for fmt in ("canonical", "trl", "openai", "kto"):
        with override_settings(ROOT_URLCONF="icrlhf.urls"):
            lines = downloaded(f"/api/v1/exports/preferences?format={fmt}", token=trainer)
        assert lines and ADDRESS not in lines, fmt
    review_side = [
        table(Item, pk=item.pk),
        table(Example, queue=queue),
        table(Call, pk=captured.pk),
        table(Step, call_id=captured.pk),
    ]
    assert ADDRESS not in json.dumps(review_side, default=str)


DEEP_ARGUMENTS = "[" * 100_000  # as long as a call's arguments may be


@pytest.mark.parametrize("mode", ["captured", "all"])
def test_arguments_nested_100000_deep_fail_neither_the_gateway_the_run_page_nor_a_correction(
    mode: str, settings: Any, llm_answer: Any
) -> None:
    settings.REDACTION = mode
    llm_answer("Done.")
    queue = QueueFactory(slug="helpdesk", n_candidates=2, capture_percent=100, reward_threshold=0.5)
    _record, token = token_create(queue=queue, name="app")
    client = Client(headers={"Authorization": f"Bearer {token}"})
    look_up = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "lookup_order", "arguments": DEEP_ARGUMENTS},
    }
    messages = [
        {"role": "user", "content": f"Where is my order? I am {ADDRESS}."},
        {"role": "assistant", "content": None, "tool_calls": [look_up]},
        {"role": "tool", "tool_call_id": "call_1", "content": DEEP_ARGUMENTS},
    ]
    answer = client.post(
        "/v1/chat/completions",
        json.dumps({"model": "helpdesk", "messages": messages, "tools": TOOLS}),
        "application/json",
        headers={"X-Icrlhf-Trajectory": "run-deep"},
    )
    assert answer.status_code == 200, answer.content
    logged = Call.objects.get(pk=answer["X-Icrlhf-Call"])
    # Planned for capture, so redacted whatever the mode (then too long to be an item).
    assert ADDRESS not in json.dumps(table(Call, pk=logged.pk), default=str)

    with override_settings(ROOT_URLCONF="icrlhf.urls"):
        run = Step.objects.get(call=logged.pk).trajectory
        page = web_client_of(queue).get(f"/q/{queue.slug}/trajectories/{run.pk}/")
        assert page.status_code == 200, page.content[-2000:]
        correction = {
            "call_id": str(logged.pk),
            "reward": 0.0,
            "corrected_action": {
                "tool_calls": [{"function": {"name": "refund", "arguments": DEEP_ARGUMENTS}}]
            },
        }
        refused = client.post(
            "/api/v1/feedback", json.dumps(correction), content_type="application/json"
        )
    assert refused.status_code == 422, refused.content
    [problem] = refused.json()["errors"]
    assert problem["field"] == "corrected_action.tool_calls.0.function.arguments"
    assert "nested deeper" in problem["message"]
    assert not Feedback.objects.filter(trajectory=run).exists()  # nothing saved
