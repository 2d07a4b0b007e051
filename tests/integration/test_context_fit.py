"""A prompt that grows with memory still fits the model: memory filled past the window of the
real local LLM (llama.cpp's server with SmolLM2, started with a small context), and a call
through the gateway still answers, with the least similar examples left out. The window is
the one the server reports (`/props`); retrieval, the embedder, the store and litellm are the
real ones. The review worker's side of the fit: tests/generation/test_context_fit.py."""

import json
from collections.abc import Iterator

import pytest
from django.conf import settings
from django.test import Client

from icrlhf.gateway.models import Call
from icrlhf.generation.context import Room, prompt_context
from icrlhf.ingest.services import token_create
from icrlhf.integrations import llm
from icrlhf.memory import index
from icrlhf.memory.selectors import examples_recall_anywhere
from icrlhf.memory.signatures import PLAIN
from icrlhf.queues.models import Queue
from tests.factories import QueueFactory, stored_example
from tests.support.local_llm import local_llm_server

pytestmark = [
    pytest.mark.integration,
    pytest.mark.llm,
    pytest.mark.django_db(transaction=True),  # the gateway's threads have their own connections
    pytest.mark.urls("icrlhf.gateway.urls"),
    pytest.mark.usefixtures("eager_tasks", "vector_store", "gateway_threads"),
]

# One slot of this many tokens: a few long examples fill it.
WINDOW = 512
STORED = 10
QUESTION = "My new card has still not arrived, what should I do?"


@pytest.fixture(scope="module")
def small_local_llm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The local server as `make run` starts it, with one slot and a small context."""
    with local_llm_server(
        settings.LOCAL_LLM,
        log_dir=tmp_path_factory.mktemp("llm"),
        slots=1,
        extra=["--ctx-size", str(WINDOW)],
    ) as api_base:
        yield api_base


def memory_filled(api_base: str) -> Queue:
    """A queue on the small server whose budget lets in more than its window holds: each
    stored example is about a sixth of the window, and all are similar to the question."""
    queue = QueueFactory(
        model="openai/smollm2",
        api_base=api_base,
        k_examples=STORED,
        example_token_budget=20_000,
        max_tokens=16,
        temperature=0.0,
        system_prompt="You are a bank's support agent. Answer in one sentence.",
    )
    stored = [
        stored_example(
            queue,
            input_text=f"My card number {n} has not arrived yet. What should I do about it?",
            output_text=(
                f"Answer {n}: Cards arrive within five working days. After that, freeze the "
                "old card in the app, check the delivery address in your profile, and order "
                "a replacement from the cards page, free of charge."
            ),
        )
        for n in range(STORED)
    ]
    index.examples_index(example_ids=[example.pk for example in stored])
    return queue


def test_memory_past_the_window_is_fitted_and_the_call_answers(small_local_llm: str) -> None:
    queue = memory_filled(small_local_llm)
    assert llm.context_window(queue.model, queue.api_base) == WINDOW  # as the server reports

    # Without the fit, the server refuses what retrieval returns.
    recall = examples_recall_anywhere(
        queue=queue,
        query_text=QUESTION,
        k=queue.k_examples,
        token_budget=queue.example_token_budget,
        pool=0,
        signature=PLAIN,
    )
    retrieved = [hit.example.pk for hit in recall.examples]
    assert len(retrieved) > STORED // 2
    context = prompt_context(
        queue=queue,
        query_text=QUESTION,
        conversation=[],
        signature=PLAIN,
        pool=0,
        retrieve=lambda **_: recall,
    )
    unfitted = context.fitted(examples=recall.examples, room=Room(window=None, answer_tokens=0))
    with pytest.raises(llm.LLMError) as refused:
        llm.complete(
            messages=unfitted.messages,
            model=queue.model,
            params={"max_tokens": queue.max_tokens},
            api_base=queue.api_base,
        )
    assert refused.value.status == 400, refused.value

    # Through the gateway: the call answers, with the most similar examples that fit.
    token = token_create(queue=queue, name="app")[1]
    response = Client(headers={"Authorization": f"Bearer {token}"}).post(
        "/v1/chat/completions",
        json.dumps({"model": queue.slug, "messages": [{"role": "user", "content": QUESTION}]}),
        content_type="application/json",
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["choices"][0]["message"]["content"]
    call = Call.objects.get()
    sent = [entry["id"] for entry in call.examples]
    assert 0 < len(sent) < len(retrieved)
    assert sent == [str(pk) for pk in retrieved[: len(sent)]]  # the most similar
    assert response["X-Icrlhf-Examples"].count(":") == len(sent)
    # The server's own count of the prompt, with the answer's room, is within its window.
    assert body["usage"]["prompt_tokens"] + queue.max_tokens <= WINDOW
