"""The gateway as applications use it: OpenAI's own Python client and litellm as a client,
against the real gateway process (uvicorn), the real worker owning the embedded store,
fastembed and litellm calling the fixed-latency endpoint over HTTP."""

import json
from collections.abc import Iterator
from typing import Any

import litellm
import openai
import pytest
from django.test import Client

from icrlhf.gateway.models import Call
from icrlhf.generation.models import Calibration
from icrlhf.generation.prompts import PromptExample, examples_sent
from icrlhf.generation.ranking import FEATURES, MEMORY_FEATURES
from icrlhf.generation.services import item_create
from icrlhf.ingest.services import token_create
from icrlhf.memory.models import Example
from icrlhf.queues.models import Item, Queue
from icrlhf.review.models import Decision
from tests.factories import QueueFactory, UserFactory
from tests.support.fixed_latency_llm import FaultyLLM, FixedLatencyLLM
from tests.support.processes import GATEWAY_LLM_TIMEOUT_S, GatewayProcess
from tests.support.waiting import wait_for
from tests.support.webhook_receiver import Receiver

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

CARD = "My new card has not arrived yet. Where is it?"
CARD_AGAIN = "I still haven't received my card, when will it come?"


def client_for(gateway: GatewayProcess, queue: Queue) -> openai.OpenAI:
    token = token_create(queue=queue, name="app")[1]
    return openai.OpenAI(base_url=gateway.base_url, api_key=token, max_retries=0)


def decided_in_workbench(queue: Queue, text: str) -> Decision:
    """A reviewer picks the first candidate on the review page, as in the browser."""
    reviewer = UserFactory()
    queue.members.add(reviewer)
    item = item_create(queue=queue, input_text=text, created_by=reviewer)
    wait_for(
        lambda: Item.objects.get(pk=item.pk).status == Item.Status.READY,
        what="the item's candidates",
    )
    browser = Client()
    browser.force_login(reviewer)
    assert browser.post(f"/q/{queue.slug}/review/next/")["Location"] == f"/items/{item.pk}/"
    browser.get(f"/items/{item.pk}/")
    candidate = item.generations.get().candidates.order_by("position").first()
    assert candidate is not None
    browser.post(f"/items/{item.pk}/decide/", {"choice": f"c{candidate.pk}"})
    decision = Decision.objects.get(item=item)
    wait_for(
        lambda: not decision.examples.exclude(index_state=Example.IndexState.INDEXED).exists(),
        what="the decision's examples to be indexed",
    )
    return decision


def test_plain_and_streamed_answers_through_the_openai_client(
    gateway_process: GatewayProcess, fixed_llm: FixedLatencyLLM
) -> None:
    queue = QueueFactory(slug="support")
    client = client_for(gateway_process, queue)

    assert [m.id for m in client.models.list()] == ["support"]
    raw = client.chat.completions.with_raw_response.create(
        model="support",
        messages=[
            {"role": "system", "content": "You are the support desk of Acme Bank."},
            {"role": "user", "content": CARD},
        ],
        temperature=0.1,
        max_tokens=50,
    )
    answer = raw.parse()
    assert answer.choices[0].message.content.endswith(f"a reply to «{CARD}».")
    assert answer.model == "support" and answer.usage is not None
    assert answer.usage.total_tokens == 22
    assert raw.headers["X-Icrlhf-Source"] == "model"
    assert raw.headers["X-Icrlhf-Memory"] == "empty"  # nothing decided in this queue yet
    sent = fixed_llm.last_request
    # The queue's system prompt first, the caller's system message after it.
    system = sent["messages"][0]["content"]
    assert system.startswith(queue.system_prompt)
    assert system.endswith(
        "The application's instructions:\nYou are the support desk of Acme Bank."
    )
    assert sent["messages"][-1] == {"role": "user", "content": CARD}
    assert sent["temperature"] == 0.1 and sent["max_tokens"] == 50

    stream = client.chat.completions.create(
        model="support",
        messages=[{"role": "user", "content": CARD}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.endswith(f"a reply to «{CARD}».")
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 12

    wait_for(lambda: Call.objects.filter(queue=queue).count() == 2, what="both calls logged")
    calls = list(Call.objects.filter(queue=queue).order_by("created_at"))
    assert [(c.source, c.stream, c.status_code) for c in calls] == [
        ("model", False, 200),
        ("model", True, 200),
    ]
    assert calls[1].answer_text == text and calls[0].request_text == CARD
    assert all(c.upstream_ms is not None and c.total_ms >= c.upstream_ms for c in calls)
    # Where the plain answer's time went, as the server reported it (a stream reports none).
    assert (calls[0].model_prompt_ms, calls[0].model_generation_ms, calls[0].asks) == (3, 7, 1)
    assert calls[1].waited_ms is None and calls[1].asks == 1


def test_a_workbench_decision_shapes_the_next_similar_gateway_call(
    gateway_process: GatewayProcess, fixed_llm: FixedLatencyLLM
) -> None:
    queue = QueueFactory(n_candidates=2, k_examples=3, memory_candidates=0)
    client = client_for(gateway_process, queue)
    decision = decided_in_workbench(queue, CARD)
    preferred = decision.examples.get(role=Example.Role.PREFERRED)

    raw = client.chat.completions.with_raw_response.create(
        model=queue.slug, messages=[{"role": "user", "content": CARD_AGAIN}]
    )
    assert raw.headers["X-Icrlhf-Memory"] == "used"
    example_id, score = raw.headers["X-Icrlhf-Examples"].split(":")
    assert example_id == str(preferred.pk) and float(score) > 0.5
    # The preferred answer went upstream quoted as reference material, not as a turn.
    messages = fixed_llm.last_request["messages"]
    assert messages[1:] == [{"role": "user", "content": CARD_AGAIN}]
    assert examples_sent(messages) == [PromptExample(CARD, preferred.output_text)]
    assert "answer reviewers preferred" in messages[0]["content"]
    rejected = decision.examples.get(role=Example.Role.REJECTED)
    assert rejected.output_text not in str(messages)


def test_memory_answers_skip_the_model_plain_and_streamed(
    gateway_process: GatewayProcess, fixed_llm: FixedLatencyLLM
) -> None:
    queue = QueueFactory(n_candidates=2, memory_candidates=0, memory_answer_threshold=0.9)
    client = client_for(gateway_process, queue)
    preferred = decided_in_workbench(queue, CARD).examples.get(role=Example.Role.PREFERRED)
    calls_before = fixed_llm.calls

    raw = client.chat.completions.with_raw_response.create(
        model=queue.slug, messages=[{"role": "user", "content": CARD}]
    )
    assert raw.parse().choices[0].message.content == preferred.output_text
    assert raw.headers["X-Icrlhf-Source"] == "memory"
    assert raw.headers["X-Icrlhf-Examples"].startswith(f"{preferred.pk}:")
    streamed = client.chat.completions.create(
        model=queue.slug, messages=[{"role": "user", "content": CARD}], stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == preferred.output_text
    assert fixed_llm.calls == calls_before  # no model call for either

    # Not similar enough: the model answers, with nothing from memory pretending otherwise.
    other = client.chat.completions.with_raw_response.create(
        model=queue.slug, messages=[{"role": "user", "content": "How do I close my account?"}]
    )
    assert other.headers["X-Icrlhf-Source"] == "model"
    assert fixed_llm.calls == calls_before + 1
    wait_for(lambda: queue.calls.count() == 3, what="three calls logged")
    assert sorted(queue.calls.values_list("source", flat=True)) == ["memory", "memory", "model"]


def test_memory_answers_by_calibrated_confidence(
    gateway_process: GatewayProcess, fixed_llm: FixedLatencyLLM
) -> None:
    """The confidence rule: the best stored answer, scored by the queue's memory-only fit on
    what memory says of it (votes for and against, nearness), is served above the queue's
    confidence and never below it; without a fitted confidence the rule cannot answer."""
    queue = QueueFactory(n_candidates=2, memory_candidates=0, memory_answer_confidence=0.8)
    client = client_for(gateway_process, queue)
    preferred = decided_in_workbench(queue, CARD).examples.get(role=Example.Role.PREFERRED)
    calls_before = fixed_llm.calls

    def asked(text: str) -> Any:
        return client.chat.completions.with_raw_response.create(
            model=queue.slug, messages=[{"role": "user", "content": text}]
        )

    assert asked(CARD).headers["X-Icrlhf-Source"] == "model"  # nothing fitted yet
    vote = 1 + MEMORY_FEATURES.index("vote")
    coefficients = [-2.0] + [0.0] * len(MEMORY_FEATURES)
    coefficients[vote] = 5.0  # confidence sigmoid(-2 + 5 × vote share): 0.95 for a sole vote
    Calibration.objects.create(
        queue=queue,
        features=list(FEATURES),
        coefficients=[0.0] * (len(FEATURES) + 1),
        top_coefficients=[0.0, 1.0],
        items=60,
        candidates=120,
        accepted_share=0.7,
        memory_fit={
            "features": list(MEMORY_FEATURES),
            "coefficients": coefficients,
            "platt": [0.0, 1.0],
            "isotonic": None,
            "items": 60,
            "accepted_share": 0.7,
            "ece": 0.04,
            "curve": [],
            "recommendations": [],
        },
    )
    raw = asked(CARD)
    assert raw.parse().choices[0].message.content == preferred.output_text
    assert raw.headers["X-Icrlhf-Source"] == "memory"
    assert float(raw.headers["X-Icrlhf-Memory-Confidence"]) == pytest.approx(0.9526, abs=1e-3)
    assert fixed_llm.calls == calls_before + 1  # the first call only

    Queue.objects.filter(pk=queue.pk).update(memory_answer_confidence=0.99)
    held_back = asked(CARD)
    assert held_back.headers["X-Icrlhf-Source"] == "model"
    assert "X-Icrlhf-Memory-Confidence" not in held_back.headers
    assert fixed_llm.calls == calls_before + 2


def test_a_captured_call_reviewed_in_the_workbench_answers_the_next_similar_call(
    gateway_process: GatewayProcess, fixed_llm: FixedLatencyLLM
) -> None:
    """The loop, closed from production: an app's call is captured for review with what it
    was served, a reviewer keeps that answer on the review page, the worker posts the
    decision webhook, and the next identical call is answered from memory while a
    paraphrase gets the answer in its prompt."""
    receiver = Receiver([])
    queue = QueueFactory(
        n_candidates=2,
        memory_candidates=0,
        capture_percent=100,
        memory_answer_threshold=0.95,
        webhook_url=receiver.url,
        webhook_secret="s3cret",
    )
    client = client_for(gateway_process, queue)
    raw = client.chat.completions.with_raw_response.create(
        model=queue.slug, messages=[{"role": "user", "content": CARD}]
    )
    served_text = raw.parse().choices[0].message.content
    call = Call.objects.get(pk=raw.headers["X-Icrlhf-Call"])
    item = wait_for(
        lambda: Item.objects.filter(calls=call, status=Item.Status.READY).first(),
        what="the captured item's candidates",
    )
    served = item.generations.get().candidates.get(served=True)
    assert served.text == served_text and item.source == Item.Source.GATEWAY

    reviewer = UserFactory()
    queue.members.add(reviewer)
    browser = Client()
    browser.force_login(reviewer)
    assert browser.post(f"/q/{queue.slug}/review/next/")["Location"] == f"/items/{item.pk}/"
    browser.post(f"/items/{item.pk}/decide/", {"choice": f"c{served.pk}"})
    decision = Decision.objects.get(item=item)
    wait_for(
        lambda: not decision.examples.exclude(index_state=Example.IndexState.INDEXED).exists(),
        what="the decision's examples to be indexed",
    )
    preferred = decision.examples.get(role=Example.Role.PREFERRED)

    calls_before = fixed_llm.calls
    again = client.chat.completions.with_raw_response.create(
        model=queue.slug, messages=[{"role": "user", "content": CARD}]
    )
    assert again.headers["X-Icrlhf-Source"] == "memory"
    assert again.parse().choices[0].message.content == served_text
    assert fixed_llm.calls == calls_before
    paraphrase = client.chat.completions.with_raw_response.create(
        model=queue.slug, messages=[{"role": "user", "content": CARD_AGAIN}]
    )
    assert paraphrase.headers["X-Icrlhf-Examples"].startswith(f"{preferred.pk}:")
    assert preferred.output_text in str(fixed_llm.last_request["messages"])

    event = wait_for(lambda: receiver.requests[:1], what="the decision webhook")[0]
    headers, body = event
    assert headers["X-Icrlhf-Event"] == "item.decided"
    payload = json.loads(body)
    assert payload["item"]["id"] == item.pk and payload["item"]["source"] == "gateway"
    assert payload["served_accepted"] is True and payload["final_text"] == served_text
    receiver.server.shutdown()


def test_litellm_as_a_client_plain_and_streamed(gateway_process: GatewayProcess) -> None:
    queue = QueueFactory(slug="litellm-app")
    token = token_create(queue=queue, name="litellm")[1]
    options: dict[str, Any] = {
        "model": "openai/litellm-app",
        "api_base": gateway_process.base_url,
        "api_key": token,
        "messages": [{"role": "user", "content": CARD}],
    }
    answer = litellm.completion(**options)
    assert answer.choices[0].message.content.endswith(f"a reply to «{CARD}».")
    pieces = [c.choices[0].delta.content or "" for c in litellm.completion(**options, stream=True)]
    assert "".join(pieces).endswith(f"a reply to «{CARD}».")


@pytest.fixture
def faulty_llm() -> Iterator[FaultyLLM]:
    llm = FaultyLLM(latency_s=0.01).start()
    yield llm
    llm.stop()


@pytest.mark.parametrize(
    ("fault", "error", "status"),
    [
        ("rate_limit", openai.RateLimitError, 429),
        ("server_error", openai.InternalServerError, 502),
        ("bad_request", openai.BadRequestError, 400),
    ],
)
def test_upstream_failures_keep_their_meaning(
    gateway_process: GatewayProcess,
    faulty_llm: FaultyLLM,
    fault: str,
    error: type[openai.APIStatusError],
    status: int,
) -> None:
    faulty_llm.fault = fault
    queue = QueueFactory(api_base=faulty_llm.api_base)
    client = client_for(gateway_process, queue)
    for stream in (False, True):
        with pytest.raises(error) as raised:
            client.chat.completions.create(
                model=queue.slug, messages=[{"role": "user", "content": CARD}], stream=stream
            )
        assert raised.value.status_code == status
        body: Any = raised.value.body
        assert body["type"] == "upstream_error" and body["message"]
    wait_for(lambda: queue.calls.count() == 2, what="both failures logged")
    assert set(queue.calls.values_list("status_code", flat=True)) == {status}


def test_an_unreachable_or_slow_upstream_is_502_or_504(gateway_process: GatewayProcess) -> None:
    unreachable = QueueFactory(api_base="http://127.0.0.1:9/v1")
    with pytest.raises(openai.InternalServerError) as raised:
        client_for(gateway_process, unreachable).chat.completions.create(
            model=unreachable.slug, messages=[{"role": "user", "content": CARD}]
        )
    assert raised.value.status_code == 502
    assert "could not be reached" in str(raised.value.body)

    # Past the call's deadline (twice LLM_TIMEOUT_S), which the upstream waits for.
    slow_llm = FixedLatencyLLM(latency_s=2 * GATEWAY_LLM_TIMEOUT_S + 2).start()
    try:
        slow = QueueFactory(api_base=slow_llm.api_base)
        with pytest.raises(openai.APIStatusError) as raised_slow:
            client_for(gateway_process, slow).chat.completions.create(
                model=slow.slug, messages=[{"role": "user", "content": CARD}]
            )
    finally:
        slow_llm.stop()
    assert raised_slow.value.status_code == 504


def test_a_dripping_stream_is_cut_at_the_calls_deadline(gateway_process: GatewayProcess) -> None:
    """Every event comes within LLM_TIMEOUT_S; the call as a whole does not come within
    GATEWAY_CALL_DEADLINE_S (twice LLM_TIMEOUT_S): the caller gets an error event then."""
    dripping = FixedLatencyLLM(latency_s=0).start()
    dripping.drip_s = GATEWAY_LLM_TIMEOUT_S * 0.6  # a dozen events: 6 times the deadline
    try:
        queue = QueueFactory(api_base=dripping.api_base)
        stream = client_for(gateway_process, queue).chat.completions.create(
            model=queue.slug,
            messages=[{"role": "user", "content": "one two three four five six seven"}],
            stream=True,
        )
        received: list[str] = []
        with pytest.raises(openai.APIError) as raised:
            for chunk in stream:
                received += [choice.delta.content or "" for choice in chunk.choices]
    finally:
        dripping.stop()
    assert "GATEWAY_CALL_DEADLINE_S" in str(raised.value)
    # Cut mid-stream at the deadline, not at the upstream's end: the answer's last word (the
    # question's, quoted back) never reached the caller.
    assert "seven" not in "".join(received)
    wait_for(lambda: Call.objects.filter(queue=queue).exists(), what="the cut call's row")
    call = Call.objects.get(queue=queue)
    assert call.status_code == 504


def test_a_token_reaches_its_own_queue_only(gateway_process: GatewayProcess) -> None:
    mine, theirs = QueueFactory(slug="mine"), QueueFactory(slug="theirs")
    client = client_for(gateway_process, mine)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(
            model=theirs.slug, messages=[{"role": "user", "content": CARD}]
        )
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve(theirs.slug)
    assert client.models.retrieve(mine.slug).id == "mine"
    stranger = openai.OpenAI(base_url=gateway_process.base_url, api_key="icr_nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        stranger.models.list()
