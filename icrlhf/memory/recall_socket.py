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
the queue answers. It is private to the service's user, three ways: it lives in a folder only
that user may enter (a socket in the shared temporary folder, at a predictable name, could be
bound first by any local user, who would then receive every query and answer with any
example); the asker talks only to a process of its own user (the peer's credentials, read
from the kernel); and the rows an answer names are read back only if the asking queue could
have retrieved them (`memory.selectors`)."""

import contextlib
import hashlib
import json
import logging
import os
import queue
import socket
import socketserver
import stat
import struct
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import close_old_connections, connections

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
# A Unix socket's path is at most 107 bytes (sun_path holds 108, with the final NUL).
_MAX_SOCKET_PATH = 107
# An ask's wait, at most (the gateway waits GATEWAY_RECALL_TIMEOUT_S, 2 s by default): beyond
# this, or not a positive number, it is malformed (a wait of 1e300 s overflows time_t).
_MAX_WAIT_S = 3600.0
# How many examples one ask may want, at most: far above any queue's (50 at most), low enough
# that the store's over-fetching (16 × k) stays a search.
_MAX_COUNT = 1000
# Ids as the database stores them (a bigger one would fail the round's one query).
_MAX_ID = 2**63 - 1
# struct ucred: a pid (signed), then a uid and a gid (unsigned).
_UCRED = "iII"


def socket_path() -> Path:
    """Where the store's owner listens: named by the broker and the memory queue (the
    address the tasks used), in a folder only this service's user may enter (`_private`).
    Raises VectorStoreUnavailable when that folder is someone else's."""
    address = f"{settings.CELERY_BROKER_URL} {settings.CELERY_MEMORY_QUEUE}"
    name = f"icrlhf-recall-{_digest(address)}.sock"
    folder = _runtime_folder()
    if len(os.fsencode(folder / name)) > _MAX_SOCKET_PATH:
        # Too deep a VAR_DIR for a socket's path. The temporary folder is short, and a folder
        # there named by our uid and the one it stands for is made and checked as private as
        # any: a user who makes it first can stop retrievals (we refuse it), never answer them.
        folder = Path(tempfile.gettempdir()) / f"icrlhf-{os.getuid()}-{_digest(str(folder))}"
    return _private(folder) / name


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _runtime_folder() -> Path:
    """The session's runtime folder when it is really ours (systemd's /run/user/<uid>: the
    user's alone, and emptied when the session ends), else the project's var folder."""
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    if os.path.isabs(runtime) and _ours(Path(runtime)):
        return Path(runtime) / "icrlhf"
    return Path(settings.VAR_DIR) / "run"


def _ours(folder: Path) -> bool:
    try:
        found = os.stat(folder)
    except OSError:
        return False
    return stat.S_ISDIR(found.st_mode) and found.st_uid == os.getuid()


def _private(folder: Path) -> Path:
    """The folder, made if missing, that only this user may enter (0o700). One of another
    user, or not a real folder (a link to elsewhere), is refused: whoever owns it could put
    their own socket in it. One of ours left open to others is closed."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        folder.mkdir(mode=0o700)
    found = os.lstat(folder)
    if not stat.S_ISDIR(found.st_mode):
        raise VectorStoreUnavailable(
            f"{folder} is not a folder (a link or a file is in its place): the recall socket "
            "is not put there. Remove it; it is made again as the service's own."
        )
    if found.st_uid != os.getuid():
        raise VectorStoreUnavailable(
            f"{folder} belongs to uid {found.st_uid}, not to this service's uid {os.getuid()}: "
            "the recall socket is not put there, nor asked there. Remove it; it is made again "
            "as the service's own."
        )
    if stat.S_IMODE(found.st_mode) & 0o077:
        logger.warning(
            "%s was open to other users (mode %o): made the service user's only (700)",
            folder,
            stat.S_IMODE(found.st_mode),
        )
        folder.chmod(0o700)
    return folder


def ask(query: dict[str, Any], *, timeout_s: float) -> dict[str, Any]:
    """The owner's answer to one retrieval (`memory.selectors.recall_as_json`'s form).
    Raises VectorStoreUnavailable when no owner listens or none answers in time, or when
    the one answering is not of this user, and EmbeddingModelMissing when the owner has no
    model."""
    path = socket_path()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.settimeout(timeout_s)
            connection.connect(str(path))
            _peer_checked(connection, path)
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
    try:
        answer = json.loads(line)
    except ValueError as error:
        raise VectorStoreUnavailable(
            f"The process answering retrievals at {path} sent an answer that cannot be read."
        ) from error
    return answer_read(answer)


def _peer_checked(connection: socket.socket, path: Path) -> None:
    """Refuses, before a word of the query is sent, a listener of another user: the folder
    keeps others from binding there, and this holds even if it did not (a folder made open,
    a socket passed on)."""
    option = getattr(socket, "SO_PEERCRED", None)
    if option is None:
        # Not Linux (the product runs on Linux; a developer's Mac may not): the kernel does
        # not say who listens, and the private folder alone keeps others out.
        return
    credentials = connection.getsockopt(socket.SOL_SOCKET, option, struct.calcsize(_UCRED))
    _pid, uid, _gid = struct.unpack(_UCRED, credentials)
    if uid != os.getuid():
        raise VectorStoreUnavailable(
            f"The process answering retrievals at {path} runs as uid {uid}, not as this "
            f"service's uid {os.getuid()}: refused, the query was not sent."
        )


def _too_slow(timeout_s: float) -> str:
    return f"The worker that owns the store did not answer in {timeout_s:g} s."


def answer_read(answer: Any) -> dict[str, Any]:
    """The owner's answer, or the error it sent raised as the asker's own."""
    if not isinstance(answer, dict):
        raise VectorStoreUnavailable("The worker that owns the store sent an unreadable answer.")
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
            if not (0 < timeout_s <= _MAX_WAIT_S):  # NaN included
                raise ValueError(timeout_s)
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
    asked: "queue.Queue[Asked | None]"


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
        # Its owner's user's only (connecting takes write permission). The folder already
        # keeps others out, from before the bind: this holds if the folder is opened later.
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
            self._server.asked.put(None)  # the answering thread's cue to end
            self.path.unlink(missing_ok=True)
            self._server = None


def _listening(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


def _answer_forever(asked: "queue.Queue[Asked | None]") -> None:
    """Answers rounds until the server stops (None), then closes its database connection:
    left open, it outlives the server (and keeps a test database from being dropped)."""
    try:
        while (first := asked.get()) is not None:
            round_ = [first]
            while len(round_) < _ROUND:
                try:
                    each = asked.get_nowait()
                except queue.Empty:
                    break
                if each is None:
                    asked.put(None)  # this round is answered, then the loop ends
                    break
                round_.append(each)
            _answer_one_round(round_)
    finally:
        connections.close_all()


def _answer_one_round(round_: list[Asked]) -> None:
    # This thread lives as long as the worker: its connection is health-checked before the
    # round, and replaced if it went bad, as before each task (worker/app.py).
    close_old_connections()
    try:
        answer_round(round_)
    except Exception:  # never let the answering thread die: the next round may succeed
        logger.exception("A round of retrievals failed")
        for each in round_:
            _answered(each, {"error": "Retrieval failed in the worker."})


@dataclass(frozen=True)
class _Retrieval:
    """One ask's query, read and checked: what `selectors.examples_recall` is called with."""

    queue_id: int
    query_text: str
    k: int
    token_budget: int
    pool: int
    signature: Signature


def _retrieval_read(query: Any) -> _Retrieval:
    """The query an asker sent, or ValueError saying what is wrong with it: whatever the line
    held (the asker is of this user, but may be buggy), a malformed ask fails alone, before
    it can reach the round's shared work (its batch of texts, its one query of queues)."""
    if not isinstance(query, dict):
        raise ValueError("The retrieval request is not an object.")
    for name, highest in (
        ("queue_id", _MAX_ID),
        ("k", _MAX_COUNT),
        ("token_budget", _MAX_ID),
        ("pool", _MAX_COUNT),
    ):
        value = query.get(name)
        # bool is an int to Python, never a count here.
        if type(value) is not int or not 0 <= value <= highest:
            raise ValueError(f"The retrieval request's {name} is not a whole number in range.")
    if not isinstance(query.get("query_text"), str):
        raise ValueError("The retrieval request's query_text is not a text.")
    signature = query.get("signature")
    try:
        read = PLAIN if signature is None else Signature.from_json(signature)
    except (AttributeError, TypeError, ValueError) as error:
        raise ValueError("The retrieval request's signature cannot be read.") from error
    return _Retrieval(
        queue_id=query["queue_id"],
        query_text=query["query_text"],
        k=query["k"],
        token_budget=query["token_budget"],
        pool=query["pool"],
        signature=read,
    )


def answer_round(round_: list[Asked]) -> None:
    """Embeds the round's texts as one batch, then searches each with its vector. An ask
    that cannot be read, or names no queue, is answered with its error alone."""
    from icrlhf.memory import selectors  # which asks through this module

    now = time.monotonic()
    waiting: list[tuple[Asked, _Retrieval]] = []
    for each in round_:
        if each.deadline <= now:
            each.done.set()  # its caller has stopped waiting: not searched for nothing
            continue
        try:
            waiting.append((each, _retrieval_read(each.query)))
        except ValueError as error:
            _answered(each, {"error": str(error)})
    if not waiting:
        return
    try:
        vectors = embeddings.embed_texts([retrieval.query_text for _, retrieval in waiting])
    except EmbeddingModelMissing as error:
        for each, _ in waiting:
            _answered(each, {"error": str(error), "missing_model": True})
        return
    queues = Queue.objects.in_bulk({retrieval.queue_id for _, retrieval in waiting})
    for (each, retrieval), vector in zip(waiting, vectors, strict=True):
        try:
            if retrieval.queue_id not in queues:
                raise VectorStoreUnavailable(f"No queue {retrieval.queue_id}.")
            recall = selectors.examples_recall(
                queue=queues[retrieval.queue_id],
                query_text=retrieval.query_text,
                k=retrieval.k,
                token_budget=retrieval.token_budget,
                pool=retrieval.pool,
                signature=retrieval.signature,
                vector=vector,
            )
            answer = selectors.recall_as_json(recall)
        except VectorStoreUnavailable as error:
            answer = {"error": str(error)}
        except Exception:
            logger.exception("A retrieval failed")
            answer = {"error": "Retrieval failed in the worker."}
        _answered(each, answer)


def _answered(asked: Asked, answer: dict[str, Any]) -> None:
    asked.answer = answer
    asked.done.set()
