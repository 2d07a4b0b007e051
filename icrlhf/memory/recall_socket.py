"""Retrieval for processes that do not own the embedded store (the gateway), answered by the
worker that does, over a Unix socket.

Qdrant's local mode admits one process per folder: the worker that consumes the memory
queue. The gateway used to ask it through the broker (a task, then its result), which cost a
round trip through Redis and Celery's bookkeeping on every call, and the worker embedded the
requests one at a time. Here the owner listens on a socket of its own, and one thread answers
what has arrived since its last round: the requests' texts are embedded as one batch
(fastembed embeds 32 short texts in about half the time per text of 32 single calls) and each
is then searched with its vector. Writes (indexing, curation) are untouched: they stay tasks
of the memory queue, with their retries and sweeps.

The socket is named by the broker and the memory queue, as the tasks were: whoever consumes
the queue answers. It is created readable and writable by its owner's user only."""

import contextlib
import hashlib
import json
import logging
import queue
import socket
import socketserver
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import close_old_connections

from icrlhf.integrations import embeddings
from icrlhf.integrations.embeddings import EmbeddingModelMissing
from icrlhf.integrations.vectors import VectorStoreUnavailable
from icrlhf.memory.signatures import PLAIN, Signature
from icrlhf.queues.models import Queue

logger = logging.getLogger(__name__)

# A request line is a queue id, a few numbers and the request's text (bounded by the API).
_MAX_LINE = 4 * 1024 * 1024
# What one round embeds at most: fastembed's batches, beyond which nothing is saved per text.
_ROUND = 32


def socket_path() -> Path:
    """Where the store's owner listens: named by the broker and the memory queue (the
    address the tasks used), short enough for any temporary folder (a socket's path is at
    most 107 bytes)."""
    address = f"{settings.CELERY_BROKER_URL} {settings.CELERY_MEMORY_QUEUE}"
    digest = hashlib.sha256(address.encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"icrlhf-recall-{digest}.sock"


def ask(query: dict[str, Any], *, timeout_s: float) -> dict[str, Any]:
    """The owner's answer to one retrieval (`memory.selectors.recall_as_json`'s form).
    Raises VectorStoreUnavailable when no owner listens or none answers in time, and
    EmbeddingModelMissing when the owner has no model."""
    path = socket_path()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.settimeout(timeout_s)
            connection.connect(str(path))
            connection.sendall(json.dumps({**query, "timeout_s": timeout_s}).encode() + b"\n")
            with connection.makefile("rb") as reply:
                line = reply.readline(_MAX_LINE)
    except TimeoutError as error:
        raise VectorStoreUnavailable(_too_slow(timeout_s)) from error
    except OSError as error:  # no socket file, nobody listening, the owner died mid-answer
        raise VectorStoreUnavailable(
            f"No worker that owns the store answers at {path}: is the memory worker running? "
            f"({error})"
        ) from error
    if not line:
        raise VectorStoreUnavailable("The worker that owns the store closed without answering.")
    return answer_read(json.loads(line))


def _too_slow(timeout_s: float) -> str:
    return f"The worker that owns the store did not answer in {timeout_s:g} s."


def answer_read(answer: dict[str, Any]) -> dict[str, Any]:
    """The owner's answer, or the error it sent raised as the asker's own."""
    if answer.get("missing_model"):
        raise EmbeddingModelMissing(answer["error"])
    if "error" in answer:
        raise VectorStoreUnavailable(answer["error"])
    return answer


@dataclass
class Asked:
    query: dict[str, Any]
    deadline: float
    done: threading.Event = field(default_factory=threading.Event)
    answer: dict[str, Any] = field(default_factory=dict)


class _Handler(socketserver.StreamRequestHandler):
    server: "_Server"

    def handle(self) -> None:
        line = self.rfile.readline(_MAX_LINE)
        try:
            query = json.loads(line)
            timeout_s = float(query.pop("timeout_s"))
        except (ValueError, KeyError, TypeError, AttributeError):
            self._reply({"error": "The retrieval request could not be read."})
            return
        asked = Asked(query=query, deadline=time.monotonic() + timeout_s)
        self.server.asked.put(asked)
        # Given up on, the asker is told so: both ends time out together, and a connection
        # closed without a word could reach it before its own timeout does.
        self._reply(asked.answer if asked.done.wait(timeout_s) else {"error": _too_slow(timeout_s)})

    def _reply(self, answer: dict[str, Any]) -> None:
        with contextlib.suppress(OSError):  # the caller stopped waiting
            self.wfile.write(json.dumps(answer).encode() + b"\n")


class _Server(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True
    # socketserver's backlog of 5 would make a burst of askers wait in connect().
    request_queue_size = 128
    asked: "queue.Queue[Asked]"


class RecallServer:
    """The store owner's end: a listening thread per connection, one thread that answers."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or socket_path()
        self._server: _Server | None = None

    def start(self) -> None:
        if _listening(self.path):
            raise VectorStoreUnavailable(
                f"Another process already answers retrievals at {self.path}."
            )
        self.path.unlink(missing_ok=True)  # left by a worker that was killed
        self._server = _Server(str(self.path), _Handler)
        # Its owner's user's only (connecting takes write permission, which the usual umask
        # already withholds from others until this narrows it further).
        self.path.chmod(0o600)
        self._server.asked = queue.Queue()
        threading.Thread(
            target=self._server.serve_forever, name="recall-accept", daemon=True
        ).start()
        threading.Thread(
            target=_answer_forever, args=(self._server.asked,), name="recall", daemon=True
        ).start()
        logger.info("Answering retrievals at %s", self.path)

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self.path.unlink(missing_ok=True)
            self._server = None


def _listening(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


def _answer_forever(asked: "queue.Queue[Asked]") -> None:
    while True:
        round_ = [asked.get()]
        while len(round_) < _ROUND:
            try:
                round_.append(asked.get_nowait())
            except queue.Empty:
                break
        # This thread lives as long as the worker: its connection is health-checked before
        # the round, and replaced if it went bad, as before each task (worker/app.py).
        close_old_connections()
        try:
            answer_round(round_)
        except Exception:  # never let the answering thread die: the next round may succeed
            logger.exception("A round of retrievals failed")
            for each in round_:
                each.answer = {"error": "Retrieval failed in the worker."}
                each.done.set()


def answer_round(round_: list[Asked]) -> None:
    """Embeds the round's texts as one batch, then searches each with its vector."""
    from icrlhf.memory import selectors  # which asks through this module

    now = time.monotonic()
    waiting = [each for each in round_ if each.deadline > now]
    for each in round_:
        if each.deadline <= now:
            each.done.set()  # its caller has stopped waiting: not searched for nothing
    if not waiting:
        return
    try:
        vectors = embeddings.embed_texts([each.query["query_text"] for each in waiting])
    except EmbeddingModelMissing as error:
        for each in waiting:
            each.answer = {"error": str(error), "missing_model": True}
            each.done.set()
        return
    queues = Queue.objects.in_bulk({each.query["queue_id"] for each in waiting})
    for each, vector in zip(waiting, vectors, strict=True):
        query = each.query
        try:
            if query["queue_id"] not in queues:
                raise VectorStoreUnavailable(f"No queue {query['queue_id']}.")
            signature = query.get("signature")
            recall = selectors.examples_recall(
                queue=queues[query["queue_id"]],
                query_text=query["query_text"],
                k=query["k"],
                token_budget=query["token_budget"],
                pool=query["pool"],
                signature=PLAIN if signature is None else Signature.from_json(signature),
                vector=vector,
            )
            each.answer = selectors.recall_as_json(recall)
        except VectorStoreUnavailable as error:
            each.answer = {"error": str(error)}
        except Exception:
            logger.exception("A retrieval failed")
            each.answer = {"error": "Retrieval failed in the worker."}
        each.done.set()
