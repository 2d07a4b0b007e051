"""A private Unix socket between processes of one service user: one JSON object per line each
way, the asker's request up, the answer down.

Private three ways: the socket lives in a folder only that user may enter (a socket in the
shared temporary folder, at a predictable name, could be bound first by any local user, who
would then receive every request and send any answer); the socket file itself is the
owner's alone; and the asker talks only to a process of its own user (the peer's
credentials, read from the kernel) before it sends a word.

The answering end accepts each connection on a thread of its own and hands the requests to
one answering thread, which answers what has arrived since its last round together: a caller
whose work is cheaper in batches (embedding texts) answers a round at a time. What a request
and an answer hold is the caller's; the socket only adds the asker's wait (`timeout_s`), so
that both ends give up together, and its own errors (`_SOCKET_ERROR`), which the asker raises
as its own: a request the socket could not read, or an answer that did not come in time."""

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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connections

logger = logging.getLogger(__name__)

# A request line is bounded by what the callers send (the API bounds a request's text).
_MAX_LINE = 4 * 1024 * 1024
# A Unix socket's path is at most 107 bytes (sun_path holds 108, with the final NUL).
_MAX_SOCKET_PATH = 107
# An ask's wait, at most: beyond this, or not a positive number, the request is malformed (a
# wait of 1e300 s overflows time_t).
_MAX_WAIT_S = 3600.0
# struct ucred: a pid (signed), then a uid and a gid (unsigned).
_UCRED = "iII"
# The key of the socket's own error, sent in place of an answer: apart from anything a
# caller's answer holds (its own errors included).
_SOCKET_ERROR = "socket_error"


class LocalSocketUnavailable(RuntimeError):
    """No answer came: the socket's folder is not this user's, the listener is another
    user's, or it answered too late, or unreadably."""


class NobodyListens(LocalSocketUnavailable):
    """No process listens at the socket (or the one listening died mid-answer)."""


def private_socket_path(*, prefix: str, address: str) -> Path:
    """Where the answering end of `address` listens: a name of `prefix` and a digest of the
    address, in a folder only this service's user may enter (`_private`). Raises
    LocalSocketUnavailable when that folder is someone else's."""
    name = f"{prefix}-{_digest(address)}.sock"
    folder = _runtime_folder()
    if len(os.fsencode(folder / name)) > _MAX_SOCKET_PATH:
        # Too deep a VAR_DIR for a socket's path. The temporary folder is short, and a folder
        # there named by our uid and the one it stands for is made and checked as private as
        # any: a user who makes it first can stop the asks (we refuse it), never answer them.
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
        raise LocalSocketUnavailable(
            f"{folder} is not a folder (a link or a file is in its place): no socket is put "
            "there. Remove it; it is made again as the service's own."
        )
    if found.st_uid != os.getuid():
        raise LocalSocketUnavailable(
            f"{folder} belongs to uid {found.st_uid}, not to this service's uid {os.getuid()}: "
            "no socket is put there, nor asked there. Remove it; it is made again as the "
            "service's own."
        )
    if stat.S_IMODE(found.st_mode) & 0o077:
        logger.warning(
            "%s was open to other users (mode %o): made the service user's only (700)",
            folder,
            stat.S_IMODE(found.st_mode),
        )
        folder.chmod(0o700)
    return folder


def ask(path: Path, request: dict[str, Any], *, timeout_s: float) -> Any:
    """The answer (a JSON value) of the process listening at `path` to `request`. Raises
    NobodyListens when no process listens there, LocalSocketUnavailable when the one
    listening is not of this user, does not answer in `timeout_s` or answers unreadably."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.settimeout(timeout_s)
            connection.connect(str(path))
            _peer_checked(connection, path)
            connection.sendall(json.dumps({**request, "timeout_s": timeout_s}).encode() + b"\n")
            with connection.makefile("rb") as reply:
                line = reply.readline(_MAX_LINE)
    except TimeoutError as error:
        raise LocalSocketUnavailable(_too_slow(timeout_s)) from error
    except OSError as error:  # no socket file, nobody listening, the owner died mid-answer
        raise NobodyListens(f"No process answers at {path} ({error})") from error
    if not line:
        raise LocalSocketUnavailable(f"The process answering at {path} closed without answering.")
    try:
        answer = json.loads(line)
    except ValueError as error:
        raise LocalSocketUnavailable(
            f"The process answering at {path} sent an answer that cannot be read."
        ) from error
    if isinstance(answer, dict) and _SOCKET_ERROR in answer:
        # The listener gave up at the same moment as this asker: the same error either way.
        raise LocalSocketUnavailable(str(answer[_SOCKET_ERROR]))
    return answer


def _peer_checked(connection: socket.socket, path: Path) -> None:
    """Refuses, before a word of the request is sent, a listener of another user: the folder
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
        raise LocalSocketUnavailable(
            f"The process answering at {path} runs as uid {uid}, not as this service's uid "
            f"{os.getuid()}: refused, the request was not sent."
        )


def _too_slow(timeout_s: float) -> str:
    return f"The answering process did not answer in {timeout_s:g} s."


@dataclass
class Asked:
    """One request waiting for the answering thread: answer it with `answered`."""

    request: Any
    deadline: float
    done: threading.Event = field(default_factory=threading.Event)
    answer: dict[str, Any] = field(default_factory=dict)


def answered(asked: Asked, answer: dict[str, Any]) -> None:
    asked.answer = answer
    asked.done.set()


# Answers a round of requests, each with `answered` (or leaves it unanswered when its deadline
# has passed: its asker has stopped waiting). Runs on the one answering thread.
type RoundAnswerer = Callable[[list[Asked]], None]


class _Handler(socketserver.StreamRequestHandler):
    server: "_Server"

    def handle(self) -> None:
        line = self.rfile.readline(_MAX_LINE)
        try:
            request = json.loads(line)
            timeout_s = float(request.pop("timeout_s"))
            if not (0 < timeout_s <= _MAX_WAIT_S):  # NaN included
                raise ValueError(timeout_s)
        except (ValueError, KeyError, TypeError, AttributeError):
            self._reply({_SOCKET_ERROR: "The request could not be read."})
            return
        asked = Asked(request=request, deadline=time.monotonic() + timeout_s)
        self.server.asked.put(asked)
        # Given up on, the asker is told so: both ends time out together, and a connection
        # closed without a word could reach it before its own timeout does.
        answer = (
            asked.answer if asked.done.wait(timeout_s) else {_SOCKET_ERROR: _too_slow(timeout_s)}
        )
        self._reply(answer)

    def _reply(self, answer: dict[str, Any]) -> None:
        with contextlib.suppress(OSError):  # the caller stopped waiting
            self.wfile.write(json.dumps(answer).encode() + b"\n")


class _Server(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True
    # socketserver's backlog of 5 would make a burst of askers wait in connect().
    request_queue_size = 128
    asked: "queue.Queue[Asked | None]"


class RoundServer:
    """The answering end: a listening thread per connection, one thread that answers rounds
    of at most `round_size` requests with `answer_round`."""

    def __init__(
        self, path: Path, *, answer_round: RoundAnswerer, round_size: int, name: str
    ) -> None:
        self.path = path
        self._answer_round = answer_round
        self._round_size = round_size
        self._name = name
        self._server: _Server | None = None

    def start(self) -> None:
        if _listening(self.path):
            raise LocalSocketUnavailable(f"Another process already answers at {self.path}.")
        self.path.unlink(missing_ok=True)  # left by a process that was killed
        self._server = _Server(str(self.path), _Handler)
        # Its owner's user's only (connecting takes write permission). The folder already
        # keeps others out, from before the bind: this holds if the folder is opened later.
        self.path.chmod(0o600)
        self._server.asked = queue.Queue()
        threading.Thread(
            target=self._server.serve_forever, name=f"{self._name}-accept", daemon=True
        ).start()
        threading.Thread(
            target=self._answer_forever, args=(self._server.asked,), name=self._name, daemon=True
        ).start()
        logger.info("Answering %s at %s", self._name, self.path)

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server.asked.put(None)  # the answering thread's cue to end
            self.path.unlink(missing_ok=True)
            self._server = None

    def _answer_forever(self, asked: "queue.Queue[Asked | None]") -> None:
        """Answers rounds until the server stops (None), then closes the thread's database
        connections (the answers read rows): left open, they outlive the server (and keep a
        test database from being dropped)."""
        try:
            while (first := asked.get()) is not None:
                round_ = [first]
                while len(round_) < self._round_size:
                    try:
                        each = asked.get_nowait()
                    except queue.Empty:
                        break
                    if each is None:
                        asked.put(None)  # this round is answered, then the loop ends
                        break
                    round_.append(each)
                self._answer_round(round_)
        finally:
            connections.close_all()


def _listening(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True
