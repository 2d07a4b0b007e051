"""`make run`'s stack survives a crashed part: the local LLM killed with SIGKILL is restarted
while the web stays up, the terminal says what happened, and an item generated while the LLM
is down ends with a readable reason that a retry clears; the gateway beside them answers an
app through the local LLM."""

import os
import re
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from django.conf import settings

from bench.world import MANAGE, ROOT, world
from icrlhf.ops.stack import free_port, http_ok, port_open
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.llm]


class RunningStack:
    def __init__(self, env: dict[str, str], port: int, gateway_port: int) -> None:
        self.env = env
        self.url = f"http://127.0.0.1:{port}/"
        self.gateway = f"http://127.0.0.1:{gateway_port}/v1"
        self.output: list[str] = []
        self.process = subprocess.Popen(
            [*MANAGE, "runstack", "--port", str(port), "--gateway-port", str(gateway_port)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.output.append(line.rstrip("\n"))

    def said(self, text: str) -> bool:
        if self.process.poll() is not None:
            raise AssertionError("runstack exited:\n" + "\n".join(self.output))
        return any(text in line for line in self.output)

    def shell(self, code: str) -> str:
        """Runs Django code in the stack's own world (its database, its broker queue)."""
        done = subprocess.run(
            [*MANAGE, "shell", "--no-imports", "-c", code],
            env=self.env,
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stderr
        return (done.stdout.strip().splitlines() or [""])[-1]

    def control(self, *args: str) -> str:
        config = Path(self.env["ICRLHF_VAR_DIR"]) / "run" / "supervisord.conf"
        done = subprocess.run(
            [*MANAGE[:1], "-m", "supervisor.supervisorctl", "-c", str(config), *args],
            capture_output=True,
            text=True,
        )
        return done.stdout


@pytest.fixture
def stack() -> Iterator[RunningStack]:
    llm_port, web_port, gateway_port = free_port(), free_port(), free_port()
    with world(
        "runstack",
        LLM_API_BASE=f"http://127.0.0.1:{llm_port}/v1",
        LLM_MODEL="openai/smollm2",
        LOCAL_LLM_MODEL_PATH=str(settings.LOCAL_LLM_MODEL_PATH),
        LLM_MAX_RETRIES="1",
    ) as here:
        # A new var directory, with no static files collected: runstack collects them.
        running = RunningStack(here.env, web_port, gateway_port)
        try:
            wait_for(lambda: running.said("icrlhf is running"), timeout_s=180, what="the stack")
            yield running
        finally:
            running.process.send_signal(signal.SIGINT)  # what Ctrl-C sends
            # Pressed again while the parts stop: the stop goes on, and nothing outlives it.
            process = running.process
            wait_for(
                lambda: (
                    any("Stopping" in line for line in running.output) or process.poll() is not None
                ),
                what="the stop to begin",
            )
            if process.poll() is None:
                process.send_signal(signal.SIGINT)
            running.process.wait(timeout=90)
    assert not any(port_open("127.0.0.1", port) for port in (web_port, llm_port, gateway_port))


def llm_pid(stack: RunningStack) -> int:
    log = (Path(stack.env["ICRLHF_VAR_DIR"]) / "log" / "supervisord.log").read_text()
    return int(re.findall(r"spawned: 'llm' with pid (\d+)", log)[-1])


ITEM_STATUS = "from icrlhf.queues.models import Item; print(Item.objects.get().status)"


def test_a_killed_llm_is_restarted_and_the_stack_carries_on(stack: RunningStack) -> None:
    api_base = stack.env["LLM_API_BASE"]
    killed = llm_pid(stack)
    os.kill(killed, signal.SIGKILL)

    wait_for(lambda: stack.said("llm ended (terminated by SIGKILL)"), what="the report")
    # The web did not go down with it: the same process, still answering (given a few
    # seconds, on two cores busy loading the model again beside a test database).
    wait_for(lambda: http_ok(f"{stack.url}accounts/login/"), timeout_s=20, what="the web")
    log = (Path(stack.env["ICRLHF_VAR_DIR"]) / "log" / "supervisord.log").read_text()
    assert len(re.findall(r"spawned: 'web' with pid", log)) == 1
    wait_for(lambda: stack.said("llm: running again"), timeout_s=60, what="the restart")
    assert llm_pid(stack) != killed
    wait_for(lambda: http_ok(f"{api_base}/models"), timeout_s=30, what="the LLM answering")
    assert stack.said("Last lines of")

    # The LLM down for good: an item ends failed with a reason a person can read.
    assert "stopped" in stack.control("stop", "llm")
    stack.shell(
        "from icrlhf.queues.models import Queue;"
        "from icrlhf.generation.services import item_create;"
        "q = Queue.objects.create(slug='t', name='T', n_candidates=1, memory_candidates=0);"
        "item_create(queue=q, input_text='Where is my card?', created_by=None)"
    )
    wait_for(lambda: stack.shell(ITEM_STATUS) == "failed", timeout_s=90, what="the failure")
    reason = stack.shell(
        "from icrlhf.generation.models import Candidate; print(Candidate.objects.get().error)"
    )
    assert "could not be reached" in reason

    # Back up, one retry clears it.
    assert "started" in stack.control("start", "llm")
    wait_for(lambda: http_ok(f"{api_base}/models"), timeout_s=60, what="the LLM answering")
    stack.shell(
        "from icrlhf.generation.models import Candidate;"
        "from icrlhf.generation.services import candidate_retry;"
        "candidate_retry(candidate_id=Candidate.objects.get().pk)"
    )
    wait_for(lambda: stack.shell(ITEM_STATUS) == "ready", timeout_s=90, what="the retried item")
    assert http_ok(f"{stack.url}accounts/login/")

    # The gateway runs beside them, and answers an app through the local LLM.
    assert stack.said(f"Apps: point an OpenAI client at {stack.gateway}")
    token = stack.shell(
        "from icrlhf.queues.models import Queue; from icrlhf.ingest.services import token_create;"
        "print(token_create(queue=Queue.objects.get(slug='t'), name='app')[1])"
    )
    client = openai.OpenAI(base_url=stack.gateway, api_key=token, max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model="t", messages=[{"role": "user", "content": "Where is my card?"}], max_tokens=16
    )
    assert raw.parse().choices[0].message.content
    assert raw.headers["X-Icrlhf-Source"] == "model"
