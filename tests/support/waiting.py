"""Waiting in a test for what another process or thread does."""

import time
from collections.abc import Callable
from typing import Any


def wait_for(check: Callable[[], Any], *, timeout_s: float = 30, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(0.1)
    raise AssertionError(f"Timed out after {timeout_s} s waiting for {what}")
