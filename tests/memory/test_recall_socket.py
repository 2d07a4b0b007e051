"""The store owner answers other processes' retrievals over its socket: the same answer as
retrieving in place, concurrent asks embedded as one batch, and a plain error (never a hang)
when no owner listens or none answers in time. A real socket, the real embedder and a real
Qdrant local store, owned by this test process as the memory worker owns it."""

import json
import socket
import stat
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from icrlhf.integrations import embeddings, vectors
from icrlhf.integrations.vectors import VectorStoreUnavailable
from icrlhf.memory import index, recall_socket
from icrlhf.memory.recall_socket import RecallServer
from icrlhf.memory.selectors import examples_recall, examples_recall_anywhere
from tests.conftest import wait_for
from tests.factories import QueueFactory, stored_example

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
def owner(settings: Any) -> Iterator[RecallServer]:
    """This process answers on a socket of its own (the session's worker has the usual one)."""
    settings.CELERY_MEMORY_QUEUE = f"recall-test-{uuid.uuid4().hex[:8]}"
    server = RecallServer()
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
    owner: RecallServer, remembering: Any, monkeypatch: pytest.MonkeyPatch, settings: Any
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

    received: list[recall_socket.Asked] = []

    class Counted(recall_socket.Asked):
        def __init__(self, **fields: Any) -> None:
            super().__init__(**fields)
            received.append(self)

    monkeypatch.setattr(recall_socket, "Asked", Counted)

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


def test_without_an_owner_the_ask_fails_at_once_with_what_to_check(settings: Any) -> None:
    settings.CELERY_MEMORY_QUEUE = f"nobody-{uuid.uuid4().hex[:8]}"
    with pytest.raises(VectorStoreUnavailable, match="is the memory worker running"):
        recall_socket.ask({"queue_id": 1, "query_text": "hello"}, timeout_s=5)


def test_an_owner_too_slow_is_given_up_on_and_answers_the_next_ask(
    owner: RecallServer, remembering: Any
) -> None:
    query = {"queue_id": remembering.pk, "query_text": "forgot my pin", "k": 1}
    query |= {"token_budget": 10_000, "pool": 0, "signature": None}
    with vectors._local_lock, pytest.raises(VectorStoreUnavailable, match="in 0.3 s"):
        recall_socket.ask(query, timeout_s=0.3)
    answer = recall_socket.ask(query, timeout_s=10)
    assert len(answer["examples"]) == 1


def test_an_owner_that_gives_up_says_so_rather_than_hanging_up(
    owner: RecallServer, remembering: Any
) -> None:
    """The owner's wait and the asker's end together: whichever comes first, the asker learns
    why (an asker still waiting when the owner gives up gets the error, not a closed line)."""
    query = {"queue_id": remembering.pk, "query_text": "forgot my pin", "k": 1}
    query |= {"token_budget": 10_000, "pool": 0, "signature": None, "timeout_s": 0.2}
    with vectors._local_lock, socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
        connection.settimeout(10)  # longer than the owner waits
        connection.connect(str(owner.path))
        connection.sendall(json.dumps(query).encode() + b"\n")
        with connection.makefile("rb") as reply:
            line = reply.readline()
    assert json.loads(line) == {"error": "The worker that owns the store did not answer in 0.2 s."}


def test_an_unknown_queue_is_a_plain_error_and_the_owner_carries_on(
    owner: RecallServer, remembering: Any
) -> None:
    query = {"query_text": "forgot my pin", "k": 1, "token_budget": 10_000, "pool": 0}
    with pytest.raises(VectorStoreUnavailable, match="No queue"):
        recall_socket.ask({**query, "queue_id": 0}, timeout_s=10)
    assert recall_socket.ask({**query, "queue_id": remembering.pk}, timeout_s=10)["examples"]


def test_the_socket_is_its_owners_alone_and_a_second_owner_is_refused(
    owner: RecallServer,
) -> None:
    assert stat.S_IMODE(owner.path.stat().st_mode) == 0o600
    with pytest.raises(VectorStoreUnavailable, match="already answers"):
        RecallServer(owner.path).start()


def test_a_socket_left_by_a_killed_owner_is_taken_over(tmp_path: Path) -> None:
    left = tmp_path / "left.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as dead:
        dead.bind(str(left))  # bound, never listening: what a killed owner leaves
    server = RecallServer(left)
    server.start()
    try:
        assert left.exists()
    finally:
        server.stop()
    assert not left.exists()
