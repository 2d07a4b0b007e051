"""The ScienceWorld benchmark, small: the package's own simulator (a Java process), its gold
trajectories replayed and stored through the review flow, the real gateway process and worker,
and the fixed-answer endpoint as the model (as bench_agent's test: its answers are no action
the simulator knows, so whatever the figures are, they are the simulator's own scoring)."""

import io
import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import call_command

from bench.scienceworld_run import Lab, Variation, gold_replay, text_action, variations
from tests.support.fixed_latency_llm import FixedLatencyLLM

pytestmark = [pytest.mark.integration]

# How every gold action of find-non-living-thing begins.
GOLD_VERBS = ("open ", "go to ", "look around", "focus on ", "move ", "pick up ", "teleport ")

ROW_KEYS = {
    "episodes",
    "success_rate",
    "success_ci95",
    "mean_score",
    "score_ci95",
    "steps_per_success",
    "episodes_without_an_action",
    "actions",
    "understood_share",
    "failed_calls",
    "first_error",
    "sample",
}


class RecordingLLM(FixedLatencyLLM):
    """The fixed-answer endpoint, keeping every request it was sent."""

    def __init__(self) -> None:
        super().__init__(latency_s=0.05)
        self.requests: list[dict[str, Any]] = []

    def answer(self, request: dict[str, Any]) -> dict[str, Any]:
        self.requests.append(request)
        return super().answer(request)


@pytest.fixture
def recording_llm() -> Iterator[RecordingLLM]:
    llm = RecordingLLM().start()
    yield llm
    llm.stop()


def test_gold_trajectories_succeed_in_the_simulator_and_a_wrong_focus_fails() -> None:
    lab = Lab(max_steps=12)
    try:
        stored, held_out = variations(lab, ["find-non-living-thing"], seed=1)
        assert len(stored) == 225 and len(held_out) == 75
        assert not {v.index for v in stored} & {v.index for v in held_out}
        gold = gold_replay(lab, held_out[0])
        assert gold.episode.success and gold.episode.score == 100
        assert gold.episode.understood == gold.episode.steps > 0
        # Each form's decision points: one a step, the text one holding the actions so far.
        assert len(gold.steps["text"]) == len(gold.steps["tools"]) == gold.episode.steps
        assert "Done so far: nothing yet" in gold.steps["text"][0].decision_point
        assert gold.steps["tools"][-1].conversation[-1]["role"] == "tool"
        lab.start(Variation("find-non-living-thing", 225))
        assert lab.names_an_action("look around") and lab.names_an_action("teleport to kitchen")
        assert not lab.names_an_action("i would go to the kitchen")
        assert lab.act("dance with the house") == "No known action matches that input."
        lab.act("teleport to outside")
        lab.act("focus on baby wolf")  # a living thing: the simulator ends the episode
        assert lab.done and not lab.episode.success and lab.episode.score < 0
        assert lab.episode.understood == 2
    finally:
        lab.close()


def test_text_actions_are_read_from_the_answer() -> None:
    assert text_action("Next action: Go to kitchen.\nThen look.") == "go to kitchen"
    assert text_action("  `focus on counter`") == "focus on counter"
    assert text_action("\n\n") == ""


def test_the_benchmark_runs_small_and_prints_its_figures(recording_llm: RecordingLLM) -> None:
    out = io.StringIO()
    call_command(
        "bench_scienceworld",
        "--held-out=2",
        "--sizes=0,2",
        "--max-steps=2",
        "--concurrency=1",
        f"--llm-api-base={recording_llm.api_base}",
        "--json",
        stdout=out,
    )
    result = json.loads(out.getvalue().strip().splitlines()[-1])
    assert result["tasks"] == ["find-non-living-thing"] and result["held_out"] == 2
    assert result["sizes"] == [0, 2] and result["max_steps"] == 2
    # Both stored trajectories replayed to success in the simulator before being stored.
    assert result["gold"]["replayed"] == result["gold"]["succeeded"] == 2
    for variant in ("text", "tools"):
        rows = result["variants"][variant]
        assert set(rows) == {"0", "2", "random"}
        for row in rows.values():
            assert set(row) == ROW_KEYS
            assert row["episodes"] == 2 and row["failed_calls"] == 0, row["first_error"]
            assert row["success_rate"] == 0 and row["mean_score"] < 100
            assert row["success_ci95"][0] == 0 < row["success_ci95"][1] < 1
            if variant == "text":  # a sentence names no action: the episode ends at once
                assert row["episodes_without_an_action"] == 2 and row["actions"] == 0
            else:  # the fixed call's argument (the question) is no action the simulator knows
                assert row["understood_share"] == 0 and 0 < row["actions"] <= 2 * 2
    # With memory, the prompts held the stored gold steps: the text agent's as its prompt and
    # the gold action; the tools agent's as OpenAI turns (an `act` call, then its result).
    sent = [request["messages"] for request in recording_llm.requests]
    assert any(
        m["role"] == "assistant" and (m.get("content") or "").startswith(GOLD_VERBS)
        for messages in sent
        for m in messages
    )
    assert any(
        m.get("tool_calls") and m["tool_calls"][0]["id"].startswith("example")
        for messages in sent
        for m in messages
    )
