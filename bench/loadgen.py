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
    """One run: each answered call's time, status and start (seconds after the run began), and
    how long the run took. A call that got no answer at all has no row in hey's CSV."""

    calls: int
    clients: int
    times_ms: list[float]
    statuses: list[int]
    offsets_s: list[float]
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

    def first_burst_and_steady(self) -> tuple[list[float], list[float]]:
        """The times of the calls answered 200 in the first burst and in the steady state.

        The `clients` connections open at once, so the first `clients` calls to start (by
        start, not by end: hey writes its rows as calls end) arrive together and queue behind
        each other; the rest arrive as earlier ones are answered."""
        by_start = sorted(range(len(self.offsets_s)), key=self.offsets_s.__getitem__)
        answered = [n for n in by_start if self.statuses[n] == 200]
        first = set(by_start[: self.clients])
        return (
            [self.times_ms[n] for n in answered if n in first],
            [self.times_ms[n] for n in answered if n not in first],
        )


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
    return _parsed(finished.stdout, calls=calls, clients=min(clients, calls))


def _parsed(output: str, *, calls: int, clients: int) -> Load:
    """hey's CSV: a row per call that got an answer, times in seconds, `offset` its start."""
    rows = list(csv.DictReader(io.StringIO(output)))
    times = [float(row["response-time"]) for row in rows]
    offsets = [float(row["offset"]) for row in rows]
    return Load(
        calls=calls,
        clients=clients,
        times_ms=[seconds * 1000 for seconds in times],
        statuses=[int(row["status-code"]) for row in rows],
        offsets_s=offsets,
        elapsed_s=max(
            (start + seconds for start, seconds in zip(offsets, times, strict=True)), default=0.0
        ),
    )
