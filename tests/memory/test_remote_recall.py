"""Asking the store's owner for a retrieval from another process: where it is asked, its
failures as the store's (VectorStoreUnavailable, which a retrieval's callers handle), and an
answer trusted only for rows the asking queue could have retrieved. (Answered for real:
tests/memory/test_recall_owner.py.)"""

import os
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from icrlhf.integrations.vectors import VectorStoreUnavailable
from icrlhf.memory import recall_owner, remote_recall
from icrlhf.memory.models import Example
from icrlhf.memory.selectors import examples_recall_anywhere
from tests.factories import QueueFactory, stored_example


@pytest.fixture
def var_dir(settings: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A project var folder of the test's own at a short path, and no session runtime
    folder."""
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    with tempfile.TemporaryDirectory(prefix="icrlhf-test-") as folder:
        settings.VAR_DIR = Path(folder) / "var"
        yield settings.VAR_DIR


def test_the_owner_is_asked_at_a_socket_named_by_the_broker_and_the_memory_queue(
    var_dir: Path, settings: Any
) -> None:
    path = remote_recall.socket_path()
    assert path.parent == var_dir / "run"
    assert path.name.startswith("icrlhf-recall-") and path.name.endswith(".sock")
    settings.CELERY_MEMORY_QUEUE = "another"
    assert remote_recall.socket_path() != path


def test_without_an_owner_the_ask_fails_at_once_with_what_to_check(
    var_dir: Path, settings: Any
) -> None:
    settings.CELERY_MEMORY_QUEUE = f"nobody-{uuid.uuid4().hex[:8]}"
    with pytest.raises(VectorStoreUnavailable, match="is the memory worker running"):
        remote_recall.ask({"queue_id": 1, "query_text": "hello"}, timeout_s=5)


def test_a_folder_of_another_user_is_refused_by_owner_and_asker(
    var_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (var_dir / "run").mkdir(parents=True, mode=0o700)
    real = os.getuid()
    monkeypatch.setattr(os, "getuid", lambda: real + 1)  # what this user made is another's
    refused = f"{var_dir / 'run'} belongs to uid {real}, not to this service's uid {real + 1}"
    with pytest.raises(VectorStoreUnavailable, match=refused):
        recall_owner.recall_server().start()
    with pytest.raises(VectorStoreUnavailable, match=refused):
        remote_recall.ask({"queue_id": 1, "query_text": "hello"}, timeout_s=5)
    assert list((var_dir / "run").iterdir()) == []


@pytest.mark.django_db
@pytest.mark.usefixtures("vector_store")  # the embedded store: asked of its owner
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
    named = (elsewhere, retired, rejected, tooled, pinned, kept)
    every = [[str(e.pk), 0.9] for e in named]
    rows = [remote_recall.row_sent(e) for e in Example.objects.filter(pk__in=[e.pk for e in named])]

    def answered_by_whoever_listens(query: dict[str, Any], *, timeout_s: float) -> Any:
        """Test double of `remote_recall.ask`: an answer that names every row it likes."""
        return {
            "examples": every,
            "neighbours": every,
            "below_minimum": every,
            "minimum": 0.3,
            "rejected": every,
            "rows": rows,
        }

    monkeypatch.setattr(remote_recall, "ask", answered_by_whoever_listens)
    recall = examples_recall_anywhere(
        queue=queue, query_text="anything", k=5, token_budget=10_000, pool=5
    )
    preferred = [(pinned.pk, 5), (kept.pk, 6)]  # ranked where the answer ranked them
    assert [(r.example.pk, r.rank) for r in recall.examples] == preferred
    assert [(r.example.pk, r.rank) for r in recall.neighbours] == preferred
    assert [(r.example.pk, r.rank) for r in recall.below_minimum] == preferred
    assert [(r.example.pk, r.rank) for r in recall.rejected] == [(rejected.pk, 3)]
    assert recall.minimum == 0.3


@pytest.mark.django_db
@pytest.mark.usefixtures("vector_store")  # the embedded store: asked of its owner
@pytest.mark.parametrize(
    "answer",
    [
        [],
        {"examples": []},
        {
            **dict.fromkeys(["examples", "neighbours", "below_minimum", "rejected"], [["x", 1]]),
            "minimum": 0.3,
        },
        {
            **dict.fromkeys(["examples", "neighbours", "below_minimum", "rejected"], []),
            "minimum": 0.3,
            "rows": [{"created_at": "not a date"}],
        },
    ],
)
def test_an_unreadable_answer_counts_as_the_store_unavailable(
    answer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(remote_recall, "ask", lambda query, *, timeout_s: answer)
    with pytest.raises(VectorStoreUnavailable, match="unreadable answer"):
        examples_recall_anywhere(
            queue=QueueFactory(), query_text="anything", k=5, token_budget=10_000, pool=5
        )


@pytest.mark.parametrize(
    ("answer", "raised"),
    [
        ({"error": "No queue 7."}, "No queue 7."),
        ("not an object", "unreadable answer"),
    ],
)
def test_an_error_answer_is_raised_as_the_store_unavailable(answer: Any, raised: str) -> None:
    with pytest.raises(VectorStoreUnavailable, match=raised):
        remote_recall.answer_read(answer)
