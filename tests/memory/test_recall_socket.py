"""The store owner answers other processes' retrievals over its socket: the same answer as
retrieving in place, concurrent asks embedded as one batch, and a plain error (never a hang)
when no owner listens or none answers in time. A real socket, the real embedder and a real
Qdrant local store, owned by this test process as the memory worker owns it.

The socket is private: in a folder only the service's user may enter, asked only of a process
of that user, and its answers name no row the asking queue could not have retrieved."""

import json
import os
import socket
import stat
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from icrlhf.integrations import embeddings, vectors
from icrlhf.integrations.vectors import VectorStoreUnavailable
from icrlhf.memory import index, recall_socket
from icrlhf.memory.models import Example
from icrlhf.memory.recall_socket import RecallServer, socket_path
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


def taken_for_another_user(monkeypatch: pytest.MonkeyPatch) -> int:
    """Test double: this process's `os.getuid` answers another uid, so that what this user
    made (a folder, a listening socket) is another user's as the code sees it. Returns the
    real uid."""
    real = os.getuid()
    monkeypatch.setattr(os, "getuid", lambda: real + 1)
    return real


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A temporary folder at a short path: pytest's tmp_path can be too deep for a socket's
    path beneath it, which would send the socket to the fallback folder."""
    with tempfile.TemporaryDirectory(prefix="icrlhf-test-") as folder:
        yield Path(folder)


@pytest.fixture
def var_dir(settings: Any, short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project var folder of the test's own, and no session runtime folder."""
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    settings.VAR_DIR = short_tmp / "var"
    return Path(settings.VAR_DIR)


def test_the_socket_lives_in_a_folder_only_the_service_user_may_enter(var_dir: Path) -> None:
    path = socket_path()
    assert path.parent == var_dir / "run"
    assert path.name.startswith("icrlhf-recall-") and path.name.endswith(".sock")
    folder = path.parent.stat()
    assert stat.S_IMODE(folder.st_mode) == 0o700 and folder.st_uid == os.getuid()


@pytest.fixture
def runtime(short_tmp: Path) -> Path:
    """A session runtime folder of this user's, as systemd makes /run/user/<uid>."""
    folder = short_tmp / "runtime"
    folder.mkdir(mode=0o700)
    return folder


def test_the_session_runtime_folder_is_used_when_it_is_ours(
    var_dir: Path, runtime: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    path = socket_path()
    assert path.parent == runtime / "icrlhf"
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700


def test_a_runtime_folder_that_is_not_a_folder_is_passed_over(
    var_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime = tmp_path / "runtime"
    runtime.write_text("")
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    assert socket_path().parent == var_dir / "run"


def test_a_runtime_folder_of_another_user_is_passed_over(
    var_dir: Path, runtime: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    taken_for_another_user(monkeypatch)
    # Passed over for the var folder, which is then made by this process's real user and so
    # refused in turn: the refusal names the folder chosen.
    with pytest.raises(VectorStoreUnavailable, match=f"{var_dir / 'run'} belongs to uid"):
        socket_path()
    assert not (runtime / "icrlhf").exists()


def test_a_folder_of_another_user_is_refused_by_owner_and_asker(
    var_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (var_dir / "run").mkdir(parents=True, mode=0o700)
    real = taken_for_another_user(monkeypatch)
    refused = f"{var_dir / 'run'} belongs to uid {real}, not to this service's uid {real + 1}"
    with pytest.raises(VectorStoreUnavailable, match=refused):
        RecallServer().start()
    with pytest.raises(VectorStoreUnavailable, match=refused):
        recall_socket.ask({"queue_id": 1, "query_text": "hello"}, timeout_s=5)
    assert list((var_dir / "run").iterdir()) == []


def test_a_folder_of_ours_open_to_others_is_closed(var_dir: Path) -> None:
    folder = var_dir / "run"
    folder.mkdir(parents=True)
    folder.chmod(0o777)
    assert socket_path().parent == folder
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700


def test_a_link_in_place_of_the_folder_is_refused(var_dir: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    var_dir.mkdir()
    (var_dir / "run").symlink_to(elsewhere)
    with pytest.raises(VectorStoreUnavailable, match="is not a folder"):
        socket_path()


def test_a_var_folder_too_deep_for_a_socket_falls_back_to_a_short_private_folder(
    settings: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    settings.VAR_DIR = tmp_path / ("v" * 100)
    path = socket_path()
    try:
        assert len(os.fsencode(path)) <= 107
        assert path.parent.parent == Path(tempfile.gettempdir())
        folder = path.parent.stat()
        assert stat.S_IMODE(folder.st_mode) == 0o700 and folder.st_uid == os.getuid()
        server = RecallServer()
        server.start()  # a socket's path longer than 107 bytes could not be bound
        server.stop()
    finally:
        if path.parent.name.startswith(f"icrlhf-{os.getuid()}-"):  # the fallback's, if made
            path.parent.rmdir()


class Impostor:
    """A listener that records what it is sent, until the asker hangs up."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.received = b""
        self._listening = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listening.bind(str(path))
        self._listening.listen()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        connection, _ = self._listening.accept()
        with connection:
            connection.settimeout(10)
            while chunk := connection.recv(65536):
                self.received += chunk

    def stop(self) -> None:
        self._thread.join(timeout=10)
        self._listening.close()


def test_a_foreign_peer_is_refused_before_the_query_is_sent(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    impostor = Impostor(short_tmp / "impostor.sock")
    monkeypatch.setattr(recall_socket, "socket_path", lambda: impostor.path)
    real = taken_for_another_user(monkeypatch)
    with pytest.raises(VectorStoreUnavailable) as refused:
        recall_socket.ask({"queue_id": 1, "query_text": "my secret question"}, timeout_s=2)
    impostor.stop()
    assert str(refused.value) == (
        f"The process answering retrievals at {impostor.path} runs as uid {real}, not as this "
        f"service's uid {real + 1}: refused, the query was not sent."
    )
    assert impostor.received == b""


def test_without_peer_credentials_the_private_folder_is_relied_on(
    owner: RecallServer, remembering: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delattr(socket, "SO_PEERCRED")  # as on a system that has none
    query = {"queue_id": remembering.pk, "query_text": "forgot my pin", "k": 1}
    query |= {"token_budget": 10_000, "pool": 0}
    assert len(recall_socket.ask(query, timeout_s=10)["examples"]) == 1


def test_an_answer_naming_another_queues_or_a_retired_example_never_reaches_the_caller(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    queue, other_queue = QueueFactory(), QueueFactory()
    kept = stored_example(queue, input_text="kept")
    pinned = stored_example(queue, input_text="pinned")
    retired = stored_example(queue, input_text="retired")
    rejected = stored_example(queue, input_text="rejected")
    tooled = stored_example(queue, input_text="made with a tool the request does not offer")
    elsewhere = stored_example(other_queue, input_text="another queue's")
    Example.objects.filter(pk=pinned.pk).update(status=Example.Status.PINNED)
    Example.objects.filter(pk=retired.pk).update(status=Example.Status.RETIRED)
    Example.objects.filter(pk=rejected.pk).update(role=Example.Role.REJECTED)
    Example.objects.filter(pk=tooled.pk).update(tool_names=["lookup"])
    every = [[str(e.pk), 0.9] for e in (elsewhere, retired, rejected, tooled, pinned, kept)]

    def answered_by_whoever_listens(query: dict[str, Any], *, timeout_s: float) -> Any:
        """Test double of `recall_socket.ask`: an answer that names every row it likes."""
        return {
            "examples": every,
            "neighbours": every,
            "below_minimum": every,
            "minimum": 0.3,
            "rejected": every,
        }

    monkeypatch.setattr(recall_socket, "ask", answered_by_whoever_listens)
    recall = examples_recall_anywhere(
        queue=queue, query_text="anything", k=5, token_budget=10_000, pool=5
    )
    preferred = [(pinned.pk, 5), (kept.pk, 6)]  # ranked where the answer ranked them
    assert [(r.example.pk, r.rank) for r in recall.examples] == preferred
    assert [(r.example.pk, r.rank) for r in recall.neighbours] == preferred
    assert [(r.example.pk, r.rank) for r in recall.below_minimum] == preferred
    assert [(r.example.pk, r.rank) for r in recall.rejected] == [(rejected.pk, 3)]
    assert recall.minimum == 0.3


@pytest.mark.parametrize(
    "answer",
    [
        [],
        {"examples": []},
        {
            **dict.fromkeys(["examples", "neighbours", "below_minimum", "rejected"], [["x", 1]]),
            "minimum": 0.3,
        },
    ],
)
def test_an_unreadable_answer_counts_as_the_store_unavailable(
    answer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(recall_socket, "ask", lambda query, *, timeout_s: answer)
    with pytest.raises(VectorStoreUnavailable, match="unreadable answer"):
        examples_recall_anywhere(
            queue=QueueFactory(), query_text="anything", k=5, token_budget=10_000, pool=5
        )


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
]


def test_a_malformed_ask_fails_alone_and_the_rest_of_its_round_is_answered(
    remembering: Any,
) -> None:
    def asked(query: Any) -> recall_socket.Asked:
        return recall_socket.Asked(query=query, deadline=time.monotonic() + 30)

    good = {"queue_id": remembering.pk, "query_text": "forgot my pin", "k": 1}
    good |= {"token_budget": 10_000, "pool": 0, "signature": None}
    bad = [asked(query) for query in MALFORMED]
    answered = asked(good)
    round_ = [*bad[:6], answered, *bad[6:]]
    recall_socket.answer_round(round_)

    assert all(each.done.is_set() for each in round_)
    assert answered.answer["examples"][0][0] == str(
        examples_recall(queue=remembering, query_text="forgot my pin", k=1, token_budget=10_000)
        .examples[0]
        .example.pk
    )
    for query, each in zip(MALFORMED, bad, strict=True):
        assert set(each.answer) == {"error"}, query
        with pytest.raises(VectorStoreUnavailable):
            recall_socket.answer_read(each.answer)


def test_a_malformed_ask_on_the_socket_is_told_so_and_the_owner_answers_the_next(
    owner: RecallServer, remembering: Any
) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
        connection.settimeout(10)
        connection.connect(str(owner.path))
        connection.sendall(json.dumps({"timeout_s": 5, "queue_id": "x"}).encode() + b"\n")
        with connection.makefile("rb") as reply:
            answer = json.loads(reply.readline())
    assert answer == {"error": "The retrieval request's queue_id is not a whole number in range."}
    query = {"queue_id": remembering.pk, "query_text": "forgot my pin", "k": 1}
    query |= {"token_budget": 10_000, "pool": 0}
    assert len(recall_socket.ask(query, timeout_s=10)["examples"]) == 1
