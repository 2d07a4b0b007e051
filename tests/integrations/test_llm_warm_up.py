"""The start-up warm-up of the LLM client (the gateway and the worker call it)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_warming_up_imports_what_a_first_call_to_an_openai_compatible_server_would() -> None:
    # In a fresh process: this one may have imported the client's resources already.
    script = (
        "import sys, django; django.setup(); from icrlhf.integrations import llm; "
        "before = 'openai.resources.chat' in sys.modules; llm.warm_up(); "
        "print(before, 'openai.resources.chat' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"},
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )

    assert done.stdout.split()[-2:] == ["False", "True"]
