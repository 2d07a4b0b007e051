"""The load generator: Debian's `hey`, a compiled HTTP client.

Thirty-two Python clients on two cores measure themselves as much as the server they call;
hey's Go workers cost a fraction of that, so what it times is the server's. It sends one body
over and over from `clients` connections kept alive, and writes each response's time as CSV
(`make loadgen` installs it)."""

import csv
import io
import json
import shutil
import subprocess
from dataclasses import dataclass
from typing import Any

_HEY_MISSING = "hey is not installed: run `make loadgen` (Debian's package `hey`)."


@dataclass(frozen=True)
class Load:
    """One run: each answered call's time and status, and how long the run took."""

    calls: int
    times_ms: list[float]
    statuses: list[int]
    elapsed_s: float

    @property
    def answered_ms(self) -> list[float]:
        """The times of the calls answered 200."""
        return [
            ms for ms, status in zip(self.times_ms, self.statuses, strict=True) if status == 200
        ]

    @property
    def errors(self) -> int:
        """Calls not answered 200, including those that got no answer at all."""
        return self.calls - len(self.answered_ms)


def hey_path() -> str:
    path = shutil.which("hey")
    if path is None:
        raise RuntimeError(_HEY_MISSING)
    return path


def post(
    url: str,
    body: dict[str, Any],
    *,
    calls: int,
    clients: int,
    headers: dict[str, str] | None = None,
    timeout_s: int = 60,
) -> Load:
    """POST `body` as JSON `calls` times from `clients` concurrent connections."""
    command = [hey_path(), "-n", str(calls), "-c", str(min(clients, calls)), "-m", "POST"]
    command += ["-T", "application/json", "-d", json.dumps(body), "-t", str(timeout_s)]
    command += ["-disable-compression", "-o", "csv"]
    for name, value in (headers or {}).items():
        command += ["-H", f"{name}: {value}"]
    finished = subprocess.run([*command, url], capture_output=True, text=True, check=True)
    return _parsed(finished.stdout, calls=calls)


def _parsed(output: str, *, calls: int) -> Load:
    """hey's CSV: a row per call that got an answer, times in seconds, `offset` its start."""
    rows = list(csv.DictReader(io.StringIO(output)))
    times = [float(row["response-time"]) for row in rows]
    ends = [float(row["offset"]) + seconds for row, seconds in zip(rows, times, strict=True)]
    return Load(
        calls=calls,
        times_ms=[seconds * 1000 for seconds in times],
        statuses=[int(row["status-code"]) for row in rows],
        elapsed_s=max(ends, default=0.0),
    )
