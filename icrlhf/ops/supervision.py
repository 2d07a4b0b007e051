"""`make run`'s process manager: supervisord keeps each part of the stack alive.

supervisord (the `supervisor` package) starts the parts, restarts one that dies with a growing
delay (1 s, 2 s, 3 s, …), gives up on a part that keeps failing to start, and stops them all
together. This module writes its configuration, starts it in the foreground, and turns its
log into lines a person can act on: which part ended, how (exit code or signal), the last
lines of that part's log, and whether it came back. A part that dies keeps the others
running: the web stays up while the LLM restarts.
"""

import re
import shlex
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

# A part that fails to start this many times in a row is given up (supervisord's FATAL).
START_RETRIES = 5
# A part that ran and then died this many times within the window is stopped for good:
# supervisord restarts a part that had started without limit, which hides a crash loop.
MAX_CRASHES = 5
CRASH_WINDOW_S = 600
TAIL_LINES = 12

_EXITED = re.compile(r"exited: (?P<name>\S+) \((?P<how>.+?); (?P<unexpected>not )?expected\)")
_SPAWNED = re.compile(r"spawned: '(?P<name>\S+)' with pid (?P<pid>\d+)")
_RUNNING = re.compile(r"success: (?P<name>\S+) entered RUNNING state")
_GAVE_UP = re.compile(r"gave up: (?P<name>\S+) entered FATAL state")


@dataclass(frozen=True)
class Part:
    name: str
    command: list[str]
    environment: dict[str, str] = field(default_factory=dict)
    # Seconds a part must stay up to count as started (a shorter life is a failed start).
    start_s: int = 3
    # Lower starts first and stops last.
    priority: int = 100


def tail(path: Path, lines: int = TAIL_LINES) -> list[str]:
    try:
        with path.open("rb") as stream:
            return [
                line.decode("utf-8", "replace").rstrip()
                for line in deque(stream, maxlen=lines)
                if line.strip()
            ]
    except OSError:
        return []


def _quoted(value: str) -> str:
    # supervisord expands %(name)s in its values: a literal % is written %%.
    return value.replace("%", "%%")


class Supervisor:
    def __init__(self, *, run_dir: Path, log_dir: Path, say: Callable[[str], None]) -> None:
        self.run_dir = run_dir
        self.log_dir = log_dir
        self.say = say
        self.parts: dict[str, Part] = {}
        self.config = run_dir / "supervisord.conf"
        self.process: subprocess.Popen[str] | None = None
        self._crashes: dict[str, deque[float]] = {}
        self._ended: set[str] = set()
        self._relay: threading.Thread | None = None

    def add(self, part: Part) -> None:
        self.parts[part.name] = part

    def log_of(self, name: str) -> Path:
        return self.log_dir / f"{name}.log"

    def config_text(self) -> str:
        socket = self.run_dir / "supervisor.sock"
        sections = [
            "[supervisord]",
            "nodaemon = true",
            f"logfile = {_quoted(str(self.log_dir / 'supervisord.log'))}",
            f"pidfile = {_quoted(str(self.run_dir / 'supervisord.pid'))}",
            f"childlogdir = {_quoted(str(self.log_dir))}",
            "loglevel = info",
            "",
            "[unix_http_server]",
            f"file = {_quoted(str(socket))}",
            "chmod = 0700",
            "",
            "[rpcinterface:supervisor]",
            "supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface",
            "",
            "[supervisorctl]",
            f"serverurl = unix://{_quoted(str(socket))}",
        ]
        for part in self.parts.values():
            environment = ",".join(
                f'{key}="{_quoted(value)}"' for key, value in part.environment.items()
            )
            sections += [
                "",
                f"[program:{part.name}]",
                f"command = {_quoted(shlex.join(part.command))}",
                f"priority = {part.priority}",
                "autostart = true",
                "autorestart = true",
                f"startsecs = {part.start_s}",
                f"startretries = {START_RETRIES}",
                "stopasgroup = true",
                "killasgroup = true",
                "stopwaitsecs = 15",
                "redirect_stderr = true",
                f"stdout_logfile = {_quoted(str(self.log_of(part.name)))}",
                "stdout_logfile_maxbytes = 10MB",
                "stdout_logfile_backups = 2",
            ]
            if environment:
                sections.append(f"environment = {environment}")
        return "\n".join(sections) + "\n"

    def start(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.config.write_text(self.config_text())
        self.process = subprocess.Popen(
            [sys.executable, "-m", "supervisor.supervisord", "-c", str(self.config)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            start_new_session=True,  # Ctrl-C reaches runstack only; it stops supervisord.
        )
        assert self.process.stdout is not None
        self._relay = threading.Thread(target=self._relay_lines, args=(self.process.stdout,))
        self._relay.daemon = True
        self._relay.start()

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def ended(self, name: str) -> bool:
        """True once supervisord has given the part up (it will not come back on its own)."""
        return name in self._ended

    def stop(self) -> None:
        """supervisord stops the parts in reverse priority, waiting for each (SIGTERM, then
        SIGKILL after stopwaitsecs)."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self._relay is not None:
            self._relay.join(timeout=5)

    def control(self, *args: str) -> str:
        """supervisorctl on this stack (`status`, `stop llm`, `start llm`); returns its output."""
        done = subprocess.run(
            [sys.executable, "-m", "supervisor.supervisorctl", "-c", str(self.config), *args],
            capture_output=True,
            text=True,
            check=False,
        )
        return done.stdout + done.stderr

    def _relay_lines(self, stream: IO[str]) -> None:
        restarting: set[str] = set()
        for line in stream:
            if match := _EXITED.search(line):
                name = match["name"]
                if match["unexpected"]:  # an exit supervisord did not ask for
                    restarting.add(name)
                    self._report_exit(name, match["how"])
            elif (match := _SPAWNED.search(line)) and match["name"] in restarting:
                self.say(f"  {match['name']}: restarting (pid {match['pid']})")
            elif (match := _RUNNING.search(line)) and match["name"] in restarting:
                restarting.discard(match["name"])
                self.say(f"  {match['name']}: running again")
            elif match := _GAVE_UP.search(line):
                name = match["name"]
                self._ended.add(name)
                restarting.discard(name)
                self.say(
                    f"  {name}: gave up after {START_RETRIES} failed starts; the rest of the "
                    f"stack carries on. Its log: {self.log_of(name)}"
                )

    def _report_exit(self, name: str, how: str) -> None:
        # supervisord says "terminated by SIGKILL" or "exit status 1".
        lines = tail(self.log_of(name))
        self.say(f"\n  {name} ended ({how}). Last lines of {self.log_of(name)}:")
        self.say("\n".join(f"    | {line}" for line in lines) or "    (the log is empty)")
        crashes = self._crashes.setdefault(name, deque())
        now = time.monotonic()
        crashes.append(now)
        while crashes and now - crashes[0] > CRASH_WINDOW_S:
            crashes.popleft()
        if len(crashes) >= MAX_CRASHES:
            self._ended.add(name)
            self.say(
                f"  {name}: ended {len(crashes)} times in {CRASH_WINDOW_S // 60} minutes; "
                "stopped for good, the rest of the stack carries on."
            )
            threading.Thread(target=self.control, args=("stop", name), daemon=True).start()
