"""End to end against the real local LLM: llama.cpp's OpenAI-compatible server with SmolLM2.

Its answers are fluent but weak, so this checks structure and behaviour, never wording."""

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from icrlhf.generation.models import Candidate
from icrlhf.generation.prompts import examples_sent
from icrlhf.generation.services import item_create
from icrlhf.kinds.triage.fields import REPLY_MIN_CHARS
from icrlhf.memory.models import Example
from icrlhf.ops.catalogue import local_model
from icrlhf.queues.models import Item
from icrlhf.review.decisions import decision_record
from tests.factories import QueueFactory, UserFactory
from tests.support.local_llm import local_llm_server
from tests.support.processes import WorkerProcess
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.llm, pytest.mark.django_db(transaction=True)]


@pytest.fixture(scope="module")
def local_llm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with local_llm_server(
        settings.LOCAL_LLM, log_dir=tmp_path_factory.mktemp("llm"), slots=settings.LOCAL_LLM_SLOTS
    ) as api_base:
        yield api_base


def test_the_loop_runs_on_the_real_local_model(
    worker_process: WorkerProcess, local_llm: str
) -> None:
    queue = QueueFactory(
        model="openai/smollm2",
        api_base=local_llm,
        n_candidates=2,
        max_tokens=40,
        system_prompt="You are a bank's support agent. Answer in one sentence.",
    )
    reviewer = UserFactory()
    item_a = item_create(
        queue=queue, input_text="My card has not arrived yet.", created_by=reviewer
    )
    wait_for(
        lambda: Item.objects.get(pk=item_a.pk).status == Item.Status.READY,
        timeout_s=120,
        what="the real model's candidates",
    )
    candidates = list(item_a.generations.get().candidates.all())
    assert all(c.status == Candidate.Status.DONE for c in candidates)
    assert all(c.text.strip() and c.completion_tokens for c in candidates)
    assert all(c.model for c in candidates)

    decision = decision_record(
        item_id=item_a.pk,
        reviewer=reviewer,
        verdict="edited",
        candidate_id=candidates[0].pk,
        final_text="Your card is on its way and should arrive within 3 working days.",
    )
    wait_for(
        lambda: not decision.examples.exclude(index_state=Example.IndexState.INDEXED).exists(),
        what="indexing",
    )
    item_b = item_create(
        queue=queue, input_text="Where is my card? It still has not come.", created_by=reviewer
    )
    wait_for(
        lambda: Item.objects.get(pk=item_b.pk).status == Item.Status.READY,
        timeout_s=120,
        what="the second generation",
    )
    generation_b = item_b.generations.get()
    assert decision.final_text in [e.output_text for e in examples_sent(generation_b.messages)]
    assert all(c.status == Candidate.Status.DONE for c in generation_b.candidates.all())
    _ranked(item_b)


def _ranked(item: Item) -> None:
    """The worker ranks a ready item's candidates after it is ready: let it finish, or its
    writes meet the teardown's flush (a deadlock on PostgreSQL)."""
    wait_for(
        lambda: not item.generations.filter(ranked_at__isnull=True).exists(),
        what="the ranking",
    )


def test_every_triage_the_local_model_proposes_is_valid(
    worker_process: WorkerProcess, local_llm: str
) -> None:
    """Structured output: the server holds SmolLM2 to the queue's schema, so its candidates
    name one of the queue's categories and a priority (before: none did)."""
    categories = ["card_arrival", "lost_or_stolen_card", "exchange_rate", "pin_blocked"]
    queue = QueueFactory(
        kind="triage",
        categories=categories,
        model="openai/smollm2",
        api_base=local_llm,
        n_candidates=3,
        max_tokens=120,
        system_prompt="You are a bank's support agent.",
    )
    item = item_create(
        queue=queue,
        input_text="Card never came\n\nI ordered my card three weeks ago and it is not here.",
        created_by=UserFactory(),
    )
    wait_for(
        lambda: Item.objects.get(pk=item.pk).status == Item.Status.READY,
        timeout_s=180,
        what="the triage candidates",
    )
    candidates = list(item.generations.get().candidates.all())
    assert len(candidates) == 3
    valid = [c for c in candidates if c.fields]
    # Sampled at temperature 0.7, one proposal in a run may still come back unreadable (the
    # benchmark measures the share, docs/benchmarks.md): two of three at least, each well formed.
    assert len(valid) >= 2, [c.parse_error or c.error or c.text for c in candidates]
    for candidate in valid:
        assert candidate.fields["category"] in categories
        assert candidate.fields["priority"] in {"low", "normal", "high", "urgent"}
        # The schema's minLength counts the characters the model wrote, spaces included, and
        # the stored reply is stripped: the length holds for the raw answer, not the field.
        assert len(json.loads(candidate.text)["reply"]) >= REPLY_MIN_CHARS
        assert candidate.fields["reply"].strip()
    _ranked(item)


def test_the_local_server_decodes_a_generations_candidates_at_once(local_llm: str) -> None:
    """llama.cpp's own server, with parallel slots: N requests are decoded in one batch."""
    with urllib.request.urlopen(local_llm.removesuffix("/v1") + "/props", timeout=10) as response:
        props = json.load(response)
    assert props["total_slots"] == settings.LOCAL_LLM_SLOTS == 4
    assert props["model_alias"] == "smollm2"


def test_the_model_file_is_the_pinned_one() -> None:
    from icrlhf.ops.models_build import sha256_of

    pinned = local_model(settings.LOCAL_LLM).sha256
    assert sha256_of(Path(settings.LOCAL_LLM_MODEL_PATH)) == pinned


def _post(url: str, body: dict[str, object]) -> dict[str, Any]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        answer: dict[str, Any] = json.load(response)
    return answer


def test_the_shipped_template_renders_a_conversation_without_tools_as_smollm2s_own(
    local_llm: str,
) -> None:
    rendered = _post(
        local_llm.removesuffix("/v1") + "/apply-template",
        {
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hi"},
            ]
        },
    )
    assert rendered["prompt"] == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_shown_one_step_the_local_model_calls_the_tool_and_llama_cpp_reads_the_call(
    local_llm: str,
) -> None:
    """SmolLM2's own template knows no tools; with the shipped one, llama.cpp shows the model
    the tools and parses its <tool_call> into OpenAI's shape. The 135M model calls no tool
    unprompted (it answers in prose); shown one step as OpenAI turns, as memory sends it, it
    calls the tool with the new request's own argument."""
    tools = [
        {
            "type": "function",
            "function": {
                "name": "lookup_order",
                "description": "Look up an order's status by its number.",
                "parameters": {
                    "type": "object",
                    "properties": {"order_id": {"type": "string"}},
                    "required": ["order_id"],
                },
            },
        }
    ]
    call = {"name": "lookup_order", "arguments": json.dumps({"order_id": "1234"})}
    example = [
        {"role": "user", "content": "Where is my order 1234?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "example1_call_0", "type": "function", "function": call}],
        },
        {"role": "tool", "tool_call_id": "example1_call_0", "content": '{"status": "in transit"}'},
        {"role": "assistant", "content": "It is in transit."},
    ]
    answer = _post(
        f"{local_llm}/chat/completions",
        {
            "model": "smollm2",
            "messages": [*example, {"role": "user", "content": "Where is my order 4821?"}],
            "tools": tools,
            "max_tokens": 60,
            "temperature": 0,
        },
    )
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "tool_calls", choice
    called = choice["message"]["tool_calls"][0]["function"]
    assert called["name"] == "lookup_order"
    assert json.loads(called["arguments"]) == {"order_id": "4821"}
