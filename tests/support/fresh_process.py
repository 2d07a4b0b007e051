"""Python code run in a fresh process with the tests' settings: for what the suite's own
process may have done already (an import, a start-up step)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def fresh_process_output(script: str) -> str:
    """What `script` prints, run by this Python with Django set up for the tests."""
    done = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()\n" + script],
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"},
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return done.stdout
