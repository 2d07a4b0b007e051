"""The agent benchmark, small: the real gateway process and worker, the desk's expert
trajectories stored through the review flow, the agent's own episodes rewarded and corrected
through the feedback API, and the fixed-answer endpoint as the model (it calls the first tool
offered with the question, then answers the tool's result in text, so its agent never
resolves a goal: whatever the figures are, they are the desk's own checks)."""

import io
import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import call_command

from bench.agent_env import GOALS, Desk, expert, tasks, text_action
from tests.support.fixed_latency_llm import FixedLatencyLLM

pytestmark = [pytest.mark.integration]


RULE = "Look the order up before anything else."


class RecordingLLM(FixedLatencyLLM):
    """The fixed-answer endpoint, keeping every request it was sent; asked as the reflector,
    it proposes one rule citing the first trace it was shown."""

    def __init__(self) -> None:
        super().__init__(latency_s=0.05)
        self.requests: list[dict[str, Any]] = []

    def answer(self, request: dict[str, Any]) -> dict[str, Any]:
        self.requests.append(request)
        answered = super().answer(request)
        schema = (request.get("response_format") or {}).get("json_schema") or {}
        if schema.get("name") == "playbook_mutations":
            change = {"op": "add", "entry": "", "section": "Orders", "text": RULE, "cites": [1]}
            answered["choices"][0]["message"]["content"] = json.dumps(
                {"mutations": [{**change, "why": "the corrected runs looked it up first"}]}
            )
        return answered


@pytest.fixture
def recording_llm() -> Iterator[RecordingLLM]:
    llm = RecordingLLM().start()
    yield llm
    llm.stop()


def test_the_desk_checks_its_goals_itself() -> None:
    every = tasks(9, seed=1)
    damaged, lost, late = (next(t for t in every if t.kind == k) for k in GOALS)
    for task in (damaged, lost, late):
        desk = Desk(task)
        for action in expert(task):
            desk.act(*action)
        assert desk.success and desk.done
    wrong = Desk(lost)
    wrong.act("refund", lost.order)
    wrong.act("escalate", lost.order)  # too late: the refund ended it
    assert not wrong.success
    other_order = Desk(damaged)
    other_order.act("refund", "1")
    assert not other_order.success
    vague = Desk(late)
    vague.act("reply", "It will come soon.")
    assert not vague.success


def test_text_actions_are_read_from_the_answer() -> None:
    assert text_action("Refund 4821.") == ("refund", "4821")
    assert text_action("lookup_order(#4821)") == ("lookup_order", "4821")
    assert text_action("reply: It arrives on Friday.\nThanks") == ("reply", "It arrives on Friday.")
    assert text_action("I am not sure.") is None


def test_the_benchmark_runs_small_and_prints_its_figures(recording_llm: RecordingLLM) -> None:
    out = io.StringIO()
    call_command(
        "bench_agent",
        "--held-out=3",
        "--sizes=0,2,3",
        "--playbook-rounds=2",
        f"--llm-api-base={recording_llm.api_base}",
        "--json",
        stdout=out,
    )
    printed = out.getvalue().strip().splitlines()
    result = json.loads(printed[-1])
    assert result["held_out"] == 3 and result["sizes"] == [0, 2, 3]
    for variant in ("tools", "text"):
        rows = result["variants"][variant]
        assert set(rows) == {"0", "2", "3", "random"}
        for row in rows.values():
            assert row["episodes"] == 3 and row["failed_calls"] == 0, row["first_error"]
            assert row["success_rate"] == 0  # the fixed answers never resolve a goal
            assert row["success_ci95"][0] == 0 < row["success_ci95"][1] < 1
            assert row["steps_per_success"] is None
    # With memory, the tools agent's prompts held stored steps as OpenAI turns (an
    # assistant's tool call, then its result); the text agent's, the stored text actions.
    sent = [request["messages"] for request in recording_llm.requests]
    assert any(
        m.get("tool_calls") and m["tool_calls"][0]["id"].startswith("example")
        for messages in sent
        for m in messages
    )
    assert any(
        m["role"] == "assistant" and (m.get("content") or "").startswith("lookup_order ")
        for messages in sent
        for m in messages
    )
    # Memory from rewards: seeded with 2 reviewed runs, then the agent's own episode on the
    # third training goal, which failed; the desk's reward (0, through the feedback API of
    # the web process) made the queue's rule store its steps as rejected.
    for variant in ("tools", "text"):
        rewarded = result["rewarded"][variant]
        assert rewarded["seeded_with"] == 2 and set(rewarded["curve"]) == {"2", "3"}
        seeded, grown = rewarded["curve"]["2"], rewarded["curve"]["3"]
        assert seeded["training"]["episodes"] == 0 and seeded["rejected_steps"] == 0
        assert grown["training"] == {"episodes": 1, "succeeded": 0, "failed_calls": 0}
        assert grown["rejected_steps"] > 0
        assert grown["preferred_steps"] == seeded["preferred_steps"] > 0
        assert grown["episodes"] == 3 and grown["failed_calls"] == 0
    # Memory from corrections, with no seed: every training episode failed at its first step
    # (a lookup of the question, not the order), and its correction through the feedback API
    # stored the desk's expert action there as preferred and the agent's as rejected.
    for variant in ("tools", "text"):
        corrected = result["corrected"][variant]
        assert corrected["seeded_with"] == 0 and set(corrected["curve"]) == {"2", "3"}
        first, grown = corrected["curve"]["2"], corrected["curve"]["3"]
        assert first["training"] == {
            "episodes": 2,
            "succeeded": 0,
            "failed_calls": 0,
            "corrected": 2,
        }
        assert grown["training"] == {
            "episodes": 1,
            "succeeded": 0,
            "failed_calls": 0,
            "corrected": 1,
        }
        assert first["preferred_steps"] == first["rejected_steps"] == 2
        assert grown["preferred_steps"] == grown["rejected_steps"] == 3
        for row in (first, grown):
            assert row["episodes"] == 3 and row["failed_calls"] == 0, row["first_error"]
            assert row["success_ci95"][0] == 0 < row["success_ci95"][1] < 1
    # The playbook learned from the corrected runs: one round read them (the second found
    # nothing new), its rule went into the agent's prompts through the gateway, with memory
    # and without, and the control (the runs' corrections shuffled) was measured too.
    for variant in ("tools", "text"):
        playbook = result["corrected"][variant]["playbook"]
        first_round, second_round = playbook["playbook_rounds"]
        assert first_round["version"] == 1 and second_round["status"] == "not started"
        assert playbook["playbook_entries"] == [f"Orders: {RULE}"]
        for arm in ("with_playbook", "playbook_alone", "with_control_playbook"):
            assert playbook[arm]["episodes"] == 3 and playbook[arm]["failed_calls"] == 0
    agents_asked = [r for r in recording_llm.requests if not r.get("response_format")]
    with_rule = [r for r in agents_asked if RULE in json.dumps(r["messages"])]
    assert len(with_rule) >= 2 * 3 * 3  # 2 variants × 3 arms × 3 goals, a step or more each
    assert any(f"{RULE}" in line for line in printed)
    queries = result["retrieval_queries"]
    assert set(queries) == {
        "last_user_message",
        "goal_and_latest_observation",
        "whole_conversation",
    }
    for row in queries.values():
        assert 0 <= row["top1_right_action"] <= 1 and row["steps"] == 6
    # After a lookup, the goal alone cannot tell the lookup from the action that follows it.
    top1 = {how: row["top1_right_action"] for how, row in queries.items()}
    assert top1["goal_and_latest_observation"] > top1["last_user_message"]
