"""The store owner answers other processes' retrievals over its socket: the same answer as
retrieving in place, concurrent asks embedded as one batch, a malformed or unanswerable ask
failing alone, and a plain error (never a hang) when the owner does not answer in time. A
real socket, the real embedder and a real Qdrant local store, owned by this test process as
the memory worker owns it. (The socket itself: tests/integrations/test_local_socket.py.)"""

import json
import socket
import time
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from icrlhf.integrations import embeddings, local_socket, vectors
from icrlhf.integrations.local_socket import Asked, RoundServer
from icrlhf.integrations.vectors import VectorStoreUnavailable
from icrlhf.memory import index, recall_owner, remote_recall
from icrlhf.memory.models import Example
from icrlhf.memory.selectors import examples_recall, examples_recall_anywhere
from icrlhf.queues.models import Queue
from tests.factories import QueueFactory, stored_example
from tests.support.waiting import wait_for

# The answering thread reads the rows with its own connection: they must be committed.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("vector_store")]

QUESTIONS = [
    "My card has not arrived yet.",
    "How do I reset my PIN?",
    "Why was I charged twice?",
    "Can I change my address?",
]
ASKED = [
    "I still haven't received my card",
    "forgot my pin",
    "double charge on my statement",
    "I moved, new address please",
    "card never came",
    "pin reset",
    "charged two times",
    "update my home address",
]


@pytest.fixture
def owner(settings: Any) -> Iterator[RoundServer]:
    """This process answers on a socket of its own (the session's worker has the usual one)."""
    settings.CELERY_MEMORY_QUEUE = f"recall-test-{uuid.uuid4().hex[:8]}"
    server = recall_owner.recall_server()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def remembering() -> Any:
    queue = QueueFactory(memory_answer_threshold=0.2)
    examples = [
        stored_example(queue, input_text=question, output_text=f"Answer {n}")
        for n, question in enumerate(QUESTIONS)
    ]
    index.examples_index(example_ids=[e.pk for e in examples])
    return queue


def ids_and_scores(found: Sequence[Any]) -> list[tuple[uuid.UUID, float]]:
    return [(r.example.pk, round(r.score, 5)) for r in found]


def test_concurrent_asks_get_the_answers_of_retrieval_in_place_embedded_as_one_batch(
    owner: RoundServer, remembering: Any, monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    settings.GATEWAY_RECALL_TIMEOUT_S = 10  # the asks wait while the store is held below
    batches: list[int] = []
    embed_texts = embeddings.embed_texts

    def counted(texts: Sequence[str]) -> list[list[float]]:
        batches.append(len(texts))
        return embed_texts(texts)

    monkeypatch.setattr(embeddings, "embed_texts", counted)

    def ask(text: str) -> Any:
        return examples_recall_anywhere(
            queue=remembering, query_text=text, k=2, token_budget=10_000, pool=3
        )

    received: list[Asked] = []

    class Counted(Asked):
        def __init__(self, **fields: Any) -> None:
            super().__init__(**fields)
            received.append(self)

    monkeypatch.setattr(local_socket, "Asked", Counted)

    # The store is busy (held here) until the owner has received all eight: the first round
    # (one ask, or the few that arrived together) waits on it, and the others queue up
    # behind it, to be answered together.
    with ThreadPoolExecutor(len(ASKED)) as pool:
        with vectors._local_lock:
            futures = [pool.submit(ask, text) for text in ASKED]
            wait_for(lambda: len(received) == len(ASKED), timeout_s=8, what="all eight asks")
        answers = [future.result(timeout=30) for future in futures]

    assert sum(batches) == len(ASKED) and max(batches) > 1, batches
    for text, answer in zip(ASKED, answers, strict=True):
        here = examples_recall(queue=remembering, query_text=text, k=2, token_budget=10_000, pool=3)
        assert ids_and_scores(answer.examples) == ids_and_scores(here.examples)
        assert ids_and_scores(answer.neighbours) == ids_and_scores(here.neighbours)
        assert answer.minimum == here.minimum
    assert answers[0].examples[0].example.input_text == "My card has not arrived yet."


def test_an_owner_too_slow_is_given_up_on_and_answers_the_next_ask(
    owner: RoundServer, remembering: Any
) -> None:
    query = {"queue_id": remembering.pk, "query_text": "forgot my pin", "k": 1}
    query |= {"queue": remote_recall.row_sent(remembering)}
    query |= {"token_budget": 10_000, "pool": 0, "signature": None}
    with vectors._local_lock, pytest.raises(VectorStoreUnavailable, match="in 0.3 s"):
        remote_recall.ask(query, timeout_s=0.3)
    answer = remote_recall.ask(query, timeout_s=10)
    assert len(answer["examples"]) == 1


def test_a_queue_row_that_is_not_the_queue_named_is_a_plain_error_and_the_owner_carries_on(
    owner: RoundServer, remembering: Any
) -> None:
    query = {"query_text": "forgot my pin", "k": 1, "token_budget": 10_000, "pool": 0}
    query |= {"queue": remote_recall.row_sent(remembering)}
    with pytest.raises(VectorStoreUnavailable, match="not the one it names"):
        remote_recall.ask({**query, "queue_id": remembering.pk + 1}, timeout_s=10)
    assert remote_recall.ask({**query, "queue_id": remembering.pk}, timeout_s=10)["examples"]


def test_the_owner_answers_with_the_rows_so_the_asker_reads_none(
    owner: RoundServer, remembering: Any, django_assert_num_queries: Any
) -> None:
    with django_assert_num_queries(0):
        recall = examples_recall_anywhere(
            queue=remembering, query_text="forgot my pin", k=2, token_budget=10_000, pool=3
        )

    here = examples_recall(
        queue=remembering, query_text="forgot my pin", k=2, token_budget=10_000, pool=3
    )
    assert [r.example.pk for r in recall.examples] == [r.example.pk for r in here.examples]
    for sent, read in zip(recall.examples, here.examples, strict=True):
        # Every column retrieval loads arrives as the database gives it, dates included.
        assert remote_recall.row_sent(sent.example) == remote_recall.row_sent(read.example)
        assert sent.example.created_at == read.example.created_at
        assert sent.example.turns == read.example.turns


def test_a_row_that_cannot_be_read_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="Queue row is not an object"):
        remote_recall.row_received(Queue, ["not", "a", "row"])
    with pytest.raises(ValueError, match="Example row cannot be read"):
        remote_recall.row_received(Example, {"created_at": "yesterday-ish"})


MALFORMED = [
    "not an object",
    {"queue_id": 1, "k": 1, "token_budget": 10_000, "pool": 0},  # no text
    {"queue_id": [1], "query_text": "pin", "k": 1, "token_budget": 10_000, "pool": 0},
    {"queue_id": "1", "query_text": "pin", "k": 1, "token_budget": 10_000, "pool": 0},
    {"queue_id": 2**70, "query_text": "pin", "k": 1, "token_budget": 10_000, "pool": 0},
    {"queue_id": 1, "query_text": 7, "k": 1, "token_budget": 10_000, "pool": 0},
    {"queue_id": 1, "query_text": "pin", "k": "1", "token_budget": 10_000, "pool": 0},
    {"queue_id": 1, "query_text": "pin", "k": True, "token_budget": 10_000, "pool": 0},
    {"queue_id": 1, "query_text": "pin", "k": 10**9, "token_budget": 10_000, "pool": 0},
    {"queue_id": 1, "query_text": "pin", "k": 1, "token_budget": -1, "pool": 0},
    {"queue_id": 1, "query_text": "pin", "k": 1, "token_budget": 1, "pool": 0, "signature": "x"},
    {"queue_id": 1, "query_text": "pin", "k": 1, "token_budget": 1, "pool": 0, "signature": 3},
    {"queue_id": 0, "query_text": "pin", "k": 1, "token_budget": 10_000, "pool": 0},  # no queue
    {"queue_id": 1, "query_text": "pin", "k": 1, "token_budget": 1, "pool": 0, "queue": [1]},
    {"queue_id": 1, "query_text": "pin", "k": 1, "token_budget": 1, "pool": 0, "queue": {"id": 2}},
]


def test_a_malformed_ask_fails_alone_and_the_rest_of_its_round_is_answered(
    remembering: Any,
) -> None:
    def asked(query: Any) -> Asked:
        return Asked(request=query, deadline=time.monotonic() + 30)

    good = {"queue_id": remembering.pk, "query_text": "forgot my pin", "k": 1}
    good |= {"queue": remote_recall.row_sent(remembering)}
    good |= {"token_budget": 10_000, "pool": 0, "signature": None}
    bad = [asked(query) for query in MALFORMED]
    answered = asked(good)
    round_ = [*bad[:6], answered, *bad[6:]]
    recall_owner.answer_round(round_)

    assert all(each.done.is_set() for each in round_)
    assert answered.answer["examples"][0][0] == str(
        examples_recall(queue=remembering, query_text="forgot my pin", k=1, token_budget=10_000)
        .examples[0]
        .example.pk
    )
    for query, each in zip(MALFORMED, bad, strict=True):
        assert set(each.answer) == {"error"}, query
        with pytest.raises(VectorStoreUnavailable):
            remote_recall.answer_read(each.answer)


def test_a_malformed_ask_on_the_socket_is_told_so_and_the_owner_answers_the_next(
    owner: RoundServer, remembering: Any
) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
        connection.settimeout(10)
        connection.connect(str(owner.path))
        connection.sendall(json.dumps({"timeout_s": 5, "queue_id": "x"}).encode() + b"\n")
        with connection.makefile("rb") as reply:
            answer = json.loads(reply.readline())
    assert answer == {"error": "The retrieval request's queue_id is not a whole number in range."}
    query = {"queue_id": remembering.pk, "query_text": "forgot my pin", "k": 1}
    query |= {"queue": remote_recall.row_sent(remembering), "token_budget": 10_000, "pool": 0}
    assert len(remote_recall.ask(query, timeout_s=10)["examples"]) == 1
