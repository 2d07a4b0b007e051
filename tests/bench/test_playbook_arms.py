"""bench_learning's playbook arms, with the reflector answered offline (the `llm_answer`
double, litellm's real path): rounds of reflection approved without a person make the learned
playbook, each arm is measured with its playbook in force, the control learns from shuffled
decisions, and the queue keeps the learned playbook."""

import json
import random
from typing import Any

import pytest

from bench.playbook_arms import playbook_arms, shuffled
from icrlhf.playbook.selectors import playbook_in_force
from icrlhf.reflection.traces import DualTrace
from tests.factories import QueueFactory, UserFactory, ranked_decision
from tests.support.llm_answer import LLMAnswer

pytestmark = pytest.mark.django_db


def _adds(text: str) -> str:
    change = {"op": "add", "entry": "", "section": "Intents", "text": text, "cites": [1]}
    return json.dumps({"mutations": [{**change, "why": ""}]})


def test_each_arm_is_measured_with_its_own_playbook_and_the_learned_one_is_kept(
    settings: Any, llm_answer: LLMAnswer
) -> None:
    settings.REFLECTION_BATCH = 2
    reviewer = UserFactory()
    queue, plain = QueueFactory(members=[reviewer]), QueueFactory()
    for _ in range(3):
        ranked_decision(queue, reviewer, pick_first=False)
    llm_answer(_adds("Name the card's intent when a card is mentioned."))
    seen: dict[str, str] = {}

    def evaluate() -> dict[str, Any]:
        arm = "control" if "learned" in seen else "learned"
        seen[arm] = playbook_in_force(queue).text
        llm_answer(_adds("Answer in French."))  # what the control's rounds hear
        return {"first_accuracy": 0.5}

    def alone() -> dict[str, Any]:
        seen["alone"] = playbook_in_force(plain).text
        return {"no_retrieval": 0.25}

    result = playbook_arms(
        queue=queue,
        plain=plain,
        reviewer=reviewer,
        rounds=3,
        rng=random.Random(7),
        evaluate=evaluate,
        alone=alone,
    )
    first, second, third = result["playbook_rounds"]
    assert (first["decisions"], first["version"]) == (2, 1)
    assert second["decisions"] == 1 and second["version"] is None  # the same rule again
    assert third["status"] == "not started"  # every losing decision was read
    learned = "Intents: Name the card's intent when a card is mentioned."
    assert result["playbook_entries"] == [learned]
    assert "Name the card's intent" in seen["learned"] and "French" not in seen["learned"]
    assert "Name the card's intent" in seen["alone"]
    assert result["control_entries"] == ["Intents: Answer in French."]  # cut to one rule
    assert "French" in seen["control"] and "card's intent" not in seen["control"]
    assert result["with_playbook"] == result["with_control_playbook"] == {"first_accuracy": 0.5}
    assert result["playbook_alone"] == {"no_retrieval": 0.25}
    assert "card's intent" in playbook_in_force(queue).text  # restored when it ends


def test_a_run_that_learns_nothing_measures_no_playbook_arm(llm_answer: LLMAnswer) -> None:
    reviewer = UserFactory()
    queue = QueueFactory(members=[reviewer])
    ranked_decision(queue, reviewer, pick_first=False)
    llm_answer(json.dumps({"mutations": []}))
    result = playbook_arms(
        queue=queue,
        plain=QueueFactory(),
        reviewer=reviewer,
        rounds=1,
        rng=random.Random(7),
        evaluate=lambda: pytest.fail("nothing to evaluate"),
        alone=lambda: pytest.fail("nothing to evaluate"),
    )
    assert result["playbook_entries"] == [] and "with_playbook" not in result


def test_the_control_moves_every_preferred_answer_to_another_request() -> None:
    traces = [
        DualTrace(
            decision_id=n,
            request=f"request {n}",
            rejected=[f"wrong {n}"],
            preferred=f"right {n}",
            verdict="chosen",
            reasons=[f"reason {n}"],
            comment="",
        )
        for n in range(6)
    ]
    moved = shuffled(traces, random.Random(7))
    assert [t.request for t in moved] == [t.request for t in traces]
    assert [t.rejected for t in moved] == [t.rejected for t in traces]
    assert sorted(t.preferred for t in moved) == sorted(t.preferred for t in traces)
    for trace in moved:
        n = trace.decision_id
        assert trace.preferred != f"right {n}"
        assert trace.reasons == [trace.preferred.replace("right", "reason")]  # moved together
