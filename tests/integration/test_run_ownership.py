"""The live probes of issue 45, as an outside application makes them: two tokens of one queue
against the real gateway process (uvicorn, the worker owning the store, the fixed-latency
model over HTTP) and the real web app (the feedback API on a live server). A run, its key and
its feedback keys belong to the token whose calls made them."""

from typing import Any

import httpx
import openai
import pytest

from icrlhf.ingest.services import token_create
from icrlhf.trajectories.models import Trajectory
from tests.factories import QueueFactory
from tests.support.processes import GatewayProcess

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

QUESTION = "My card is blocked."


class App:
    """One application: its token, its OpenAI client on the gateway, its feedback calls."""

    def __init__(self, token: str, gateway: GatewayProcess, web_url: str) -> None:
        self.token, self.web_url = token, web_url
        self.client = openai.OpenAI(base_url=gateway.base_url, api_key=token, max_retries=0)

    def ask(self, slug: str, messages: list[dict[str, Any]], run: str = "") -> tuple[str, str]:
        """The answer's text and the call's id (X-Icrlhf-Call)."""
        headers = {"X-Icrlhf-Trajectory": run} if run else {}
        raw = self.client.chat.completions.with_raw_response.create(
            model=slug,
            messages=messages,
            temperature=0,
            extra_headers=headers,  # type: ignore[arg-type]
        )
        return raw.parse().choices[0].message.content or "", raw.headers["X-Icrlhf-Call"]

    def feedback(self, body: dict[str, Any], key: str = "") -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.token}"}
        if key:
            headers["Idempotency-Key"] = key
        return httpx.post(f"{self.web_url}/api/v1/feedback", json=body, headers=headers)


def test_two_tokens_of_one_queue_never_share_a_run_or_a_feedback_key(
    gateway_process: GatewayProcess, live_server: Any
) -> None:
    queue = QueueFactory(capture_percent=0)
    alice, bob = (
        App(token_create(queue=queue, name=name)[1], gateway_process, live_server.url)
        for name in ("app A", "app B")
    )
    # Probe 1: B sends A's question and A's answer back with its own words.
    asked = {"role": "user", "content": QUESTION}
    answer, alice_call = alice.ask(queue.slug, [asked])
    said = [asked, {"role": "assistant", "content": answer}]
    _, bob_call = bob.ask(queue.slug, [*said, {"role": "user", "content": "I am someone else."}])
    on_alice = alice.feedback({"call_id": alice_call, "reward": 1.0})
    on_bob = bob.feedback({"call_id": bob_call, "reward": 0.0})
    assert (on_alice.status_code, on_bob.status_code) == (201, 201), on_bob.text
    assert on_alice.json()["trajectory_id"] != on_bob.json()["trajectory_id"]
    # Another token's call is out of reach, as if it did not exist.
    stolen = bob.feedback({"call_id": alice_call, "reward": 0.0})
    assert stolen.status_code == 404 and "Nothing was saved" in stolen.json()["detail"]

    # Probe 2: A opens a named run; B names the same run: B's call is a run of B's own.
    alice.ask(queue.slug, [{"role": "user", "content": "Open run 42."}], run="probe-run-42")
    alice_run = Trajectory.objects.get(token__name="app A", key="probe-run-42")
    assert bob.feedback({"trajectory_id": "probe-run-42", "success": False}).status_code == 404
    bob.ask(queue.slug, [{"role": "user", "content": "Me too."}], run="probe-run-42")
    into_own = bob.feedback({"trajectory_id": "probe-run-42", "success": False})
    assert into_own.status_code == 201
    assert into_own.json()["trajectory_id"] != str(alice_run.pk)
    alice_run.refresh_from_db()
    assert (alice_run.step_count, alice_run.outcome) == (1, "")
    assert bob.feedback({"trajectory_id": str(alice_run.pk), "success": False}).status_code == 404

    # Probe 3: one feedback id, two tokens: each its own record, reward and run.
    first = alice.feedback({"trajectory_id": "probe-run-42", "reward": 0.9}, key="probe-k1")
    second = bob.feedback({"call_id": bob_call, "reward": 0.2}, key="probe-k1")
    assert (first.status_code, second.status_code) == (201, 201), second.text
    assert second.json()["trajectory_id"] == on_bob.json()["trajectory_id"]
    assert second.json()["reward"] == 0.2
    # The same key and body again: the first answer; another body: 409, nothing changed.
    again = bob.feedback({"call_id": bob_call, "reward": 0.2}, key="probe-k1")
    assert again.status_code == 200 and again.json()["id"] == second.json()["id"]
    other = bob.feedback({"call_id": bob_call, "reward": 0.7}, key="probe-k1")
    assert other.status_code == 409 and "reward" in other.json()["detail"]
