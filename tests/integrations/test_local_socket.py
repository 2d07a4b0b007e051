"""The private local socket: asked and answered a line of JSON each way, in rounds, and a plain
error (never a hang) when nobody listens or answers in time. A real socket, answered by this
test process with a function of the test's.

The socket is private: in a folder only the service's user may enter, the socket file its
owner's alone, asked only of a process of that user."""

import json
import os
import socket
import stat
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from icrlhf.integrations import local_socket
from icrlhf.integrations.local_socket import (
    Asked,
    LocalSocketUnavailable,
    NobodyListens,
    RoundServer,
    answered,
    private_socket_path,
)
from tests.support.waiting import wait_for


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A temporary folder at a short path: pytest's tmp_path can be too deep for a socket's
    path beneath it, which would send the socket to the fallback folder."""
    with tempfile.TemporaryDirectory(prefix="icrlhf-test-") as folder:
        yield Path(folder)


class Echo:
    """Answers each request with itself, a round at a time, unless held (`hold`)."""

    def __init__(self) -> None:
        self.rounds: list[int] = []
        self.received: list[Asked] = []
        self.hold = threading.Event()
        self.hold.set()

    def __call__(self, round_: list[Asked]) -> None:
        self.hold.wait()
        self.rounds.append(len(round_))
        for each in round_:
            if each.deadline > time.monotonic():
                answered(each, {"echo": each.request})


@pytest.fixture
def echo() -> Echo:
    return Echo()


@pytest.fixture
def server(short_tmp: Path, echo: Echo) -> Iterator[RoundServer]:
    answering = RoundServer(short_tmp / "echo.sock", answer_round=echo, round_size=32, name="echo")
    answering.start()
    yield answering
    answering.stop()


def test_a_request_gets_its_answer(server: RoundServer) -> None:
    assert local_socket.ask(server.path, {"text": "hello"}, timeout_s=5) == {
        "echo": {"text": "hello"}
    }


def test_the_asks_that_arrive_together_are_answered_as_one_round(
    server: RoundServer, echo: Echo, monkeypatch: pytest.MonkeyPatch
) -> None:
    received: list[Asked] = []

    class Counted(Asked):
        def __init__(self, **fields: Any) -> None:
            super().__init__(**fields)
            received.append(self)

    monkeypatch.setattr(local_socket, "Asked", Counted)
    echo.hold.clear()  # the first round waits until all eight have arrived
    with ThreadPoolExecutor(8) as pool:
        futures = [
            pool.submit(local_socket.ask, server.path, {"n": n}, timeout_s=10) for n in range(8)
        ]
        wait_for(lambda: len(received) == 8, timeout_s=8, what="all eight asks")
        echo.hold.set()
        answers = [future.result(timeout=30) for future in futures]
    assert answers == [{"echo": {"n": n}} for n in range(8)]
    assert sum(echo.rounds) == 8 and max(echo.rounds) > 1, echo.rounds


def test_without_a_listener_the_ask_fails_at_once(short_tmp: Path) -> None:
    with pytest.raises(NobodyListens, match="No process answers at"):
        local_socket.ask(short_tmp / "nobody.sock", {}, timeout_s=5)


def test_a_listener_too_slow_is_given_up_on_and_answers_the_next_ask(
    server: RoundServer, echo: Echo
) -> None:
    echo.hold.clear()
    with pytest.raises(LocalSocketUnavailable, match="did not answer in 0.3 s"):
        local_socket.ask(server.path, {"n": 1}, timeout_s=0.3)
    echo.hold.set()
    assert local_socket.ask(server.path, {"n": 2}, timeout_s=10) == {"echo": {"n": 2}}


def test_a_listener_that_gives_up_says_so_rather_than_hanging_up(
    server: RoundServer, echo: Echo
) -> None:
    """The listener's wait and the asker's end together: whichever comes first, the asker
    learns why (an asker still waiting when the listener gives up gets the error, not a
    closed line)."""
    echo.hold.clear()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.settimeout(10)  # longer than the listener waits
            connection.connect(str(server.path))
            connection.sendall(json.dumps({"n": 1, "timeout_s": 0.2}).encode() + b"\n")
            with connection.makefile("rb") as reply:
                line = reply.readline()
    finally:
        echo.hold.set()
    assert json.loads(line) == {"socket_error": "The answering process did not answer in 0.2 s."}


@pytest.mark.parametrize(
    "line",
    [b"not json\n", b"[1]\n", b'{"n": 1}\n', b'{"timeout_s": 0}\n', b'{"timeout_s": "NaN"}\n'],
)
def test_a_malformed_request_is_told_so_and_the_listener_answers_the_next(
    server: RoundServer, line: bytes
) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
        connection.settimeout(10)
        connection.connect(str(server.path))
        connection.sendall(line)
        with connection.makefile("rb") as reply:
            assert json.loads(reply.readline()) == {
                "socket_error": "The request could not be read."
            }
    assert local_socket.ask(server.path, {"n": 2}, timeout_s=10) == {"echo": {"n": 2}}


def test_the_socket_is_its_owners_alone_and_a_second_listener_is_refused(
    server: RoundServer, echo: Echo
) -> None:
    assert stat.S_IMODE(server.path.stat().st_mode) == 0o600
    second = RoundServer(server.path, answer_round=echo, round_size=1, name="second")
    with pytest.raises(LocalSocketUnavailable, match="already answers"):
        second.start()


def test_a_socket_left_by_a_killed_listener_is_taken_over(short_tmp: Path, echo: Echo) -> None:
    left = short_tmp / "left.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as dead:
        dead.bind(str(left))  # bound, never listening: what a killed listener leaves
    server = RoundServer(left, answer_round=echo, round_size=1, name="echo")
    server.start()
    try:
        assert local_socket.ask(left, {"n": 1}, timeout_s=5) == {"echo": {"n": 1}}
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
def var_dir(settings: Any, short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project var folder of the test's own, and no session runtime folder."""
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    settings.VAR_DIR = short_tmp / "var"
    return Path(settings.VAR_DIR)


def a_path() -> Path:
    return private_socket_path(prefix="icrlhf-test", address="somewhere")


def test_the_socket_lives_in_a_folder_only_the_service_user_may_enter(var_dir: Path) -> None:
    path = a_path()
    assert path.parent == var_dir / "run"
    assert path.name.startswith("icrlhf-test-") and path.name.endswith(".sock")
    assert path != private_socket_path(prefix="icrlhf-test", address="elsewhere")
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
    path = a_path()
    assert path.parent == runtime / "icrlhf"
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700


def test_a_runtime_folder_that_is_not_a_folder_is_passed_over(
    var_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime = tmp_path / "runtime"
    runtime.write_text("")
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    assert a_path().parent == var_dir / "run"


def test_a_runtime_folder_of_another_user_is_passed_over(
    var_dir: Path, runtime: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    taken_for_another_user(monkeypatch)
    # Passed over for the var folder, which is then made by this process's real user and so
    # refused in turn: the refusal names the folder chosen.
    with pytest.raises(LocalSocketUnavailable, match=f"{var_dir / 'run'} belongs to uid"):
        a_path()
    assert not (runtime / "icrlhf").exists()


def test_a_folder_of_another_user_is_refused(
    var_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (var_dir / "run").mkdir(parents=True, mode=0o700)
    real = taken_for_another_user(monkeypatch)
    refused = f"{var_dir / 'run'} belongs to uid {real}, not to this service's uid {real + 1}"
    with pytest.raises(LocalSocketUnavailable, match=refused):
        a_path()
    assert list((var_dir / "run").iterdir()) == []


def test_a_folder_of_ours_open_to_others_is_closed(var_dir: Path) -> None:
    folder = var_dir / "run"
    folder.mkdir(parents=True)
    folder.chmod(0o777)
    assert a_path().parent == folder
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700


def test_a_link_in_place_of_the_folder_is_refused(var_dir: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    var_dir.mkdir()
    (var_dir / "run").symlink_to(elsewhere)
    with pytest.raises(LocalSocketUnavailable, match="is not a folder"):
        a_path()


def test_a_var_folder_too_deep_for_a_socket_falls_back_to_a_short_private_folder(
    settings: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, echo: Echo
) -> None:
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    settings.VAR_DIR = tmp_path / ("v" * 100)
    path = a_path()
    try:
        assert len(os.fsencode(path)) <= 107
        assert path.parent.parent == Path(tempfile.gettempdir())
        folder = path.parent.stat()
        assert stat.S_IMODE(folder.st_mode) == 0o700 and folder.st_uid == os.getuid()
        server = RoundServer(path, answer_round=echo, round_size=1, name="echo")
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


def test_a_foreign_peer_is_refused_before_the_request_is_sent(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    impostor = Impostor(short_tmp / "impostor.sock")
    real = taken_for_another_user(monkeypatch)
    with pytest.raises(LocalSocketUnavailable) as refused:
        local_socket.ask(impostor.path, {"text": "my secret question"}, timeout_s=2)
    impostor.stop()
    assert str(refused.value) == (
        f"The process answering at {impostor.path} runs as uid {real}, not as this "
        f"service's uid {real + 1}: refused, the request was not sent."
    )
    assert impostor.received == b""


def test_without_peer_credentials_the_private_folder_is_relied_on(
    server: RoundServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delattr(socket, "SO_PEERCRED")  # as on a system that has none
    assert local_socket.ask(server.path, {"n": 1}, timeout_s=10) == {"echo": {"n": 1}}
