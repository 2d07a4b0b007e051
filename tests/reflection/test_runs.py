"""Reflection on agents' runs: a run with a step the application rewarded low or corrected is
read as a dual trace (its weak steps beside the accepted ones, with the correction), redacted,
this queue's only; a change may cite it, and the rule it becomes keeps the run as a source."""

import json
from typing import Any

import pytest
from django.test import Client

from icrlhf.gateway.models import Call
from icrlhf.integrations import llm
from icrlhf.reflection import services
from icrlhf.reflection.prompts import reflector_messages
from icrlhf.reflection.traces import run_traces, weak_runs
from icrlhf.trajectories.models import Feedback, Trajectory
from tests.factories import QueueFactory, UserFactory, agent_step, member_add, ranked_decision
from tests.support.llm_answer import LLMAnswer

pytestmark = pytest.mark.django_db

LOOK_UP = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "look_up_order", "arguments": '{"order_id": "4821"}'},
}
REFUND = {
    "id": "call_2",
    "type": "function",
    "function": {"name": "refund", "arguments": '{"order_id": "4821"}'},
}


def _run(queue: Any, key: str, goal: str) -> Trajectory:
    """A run of two steps: it looks the order up, then refunds it."""
    first = agent_step(queue, [{"role": "user", "content": goal}], key=key, tool_calls=[LOOK_UP])
    agent_step(
        queue,
        [
            {"role": "user", "content": goal},
            {"role": "assistant", "content": None, "tool_calls": [LOOK_UP]},
            {"role": "tool", "tool_call_id": "call_1", "content": "delivered"},
        ],
        key=key,
        tool_calls=[REFUND],
    )
    return first.trajectory


def _corrected(run: Trajectory, comment: str) -> None:
    """The application corrects the run's second step: it should have asked first."""
    Feedback.objects.create(
        queue=run.queue,
        trajectory=run,
        step=run.steps.get(position=1),
        key=f"fix-{run.pk}",
        reward=0.0,
        comment=comment,
        corrected_action={"content": "Shall I refund order 4821?"},
    )


def test_runs_with_a_corrected_or_failed_step_are_read_beside_their_accepted_steps(
    user: Any,
) -> None:
    queue = QueueFactory(members=[user], reward_threshold=0.5)
    corrected = _run(queue, "a", "Refund my order, I am ana@example.com")
    _corrected(corrected, "Ask before refunding, ana@example.com complained")
    failed = _run(queue, "b", "Where is my order?")
    Trajectory.objects.filter(pk=failed.pk).update(outcome=Trajectory.Outcome.FAILED)
    _run(queue, "c", "Refund order 7")  # nothing weak: never read
    declined = _run(queue, "d", "Refund order 9")
    _corrected(declined, "kept out")
    Trajectory.objects.filter(pk=declined.pk).update(approval=Trajectory.Approval.DECLINED)
    elsewhere = _run(QueueFactory(members=[user]), "e", "Refund order 8")
    _corrected(elsewhere, "another queue's")

    found = weak_runs(queue, read=set(), limit=10)
    assert {run.pk for run in found} == {corrected.pk, failed.pk}
    assert weak_runs(queue, read={str(corrected.pk)}, limit=10) == [failed]

    (trace,) = run_traces(queue, [corrected])
    assert "ana@example.com" not in trace.goal  # redacted for the reflector
    accepted, weak = trace.steps
    assert (accepted.weak, weak.weak) == (False, True)
    assert accepted.action == 'look_up_order({"order_id": "4821"})'
    assert weak.correction == "Shall I refund order 4821?"
    assert "ana@example.com" not in weak.comment and weak.comment.startswith("Ask before")
    (failed_trace,) = run_traces(queue, [failed])
    assert all(step.weak for step in failed_trace.steps)  # the run failed: every step is weak

    content = reflector_messages(version_number=None, entries=[], log=[], traces=[], runs=[trace])
    system, prompt = content[0]["content"], content[1]["content"]
    assert "runs of an agent" in system
    assert "Run 1\n" in prompt and "Step 2 (weak): refund(" in prompt
    assert "Would have been right: Shall I refund order 4821?" in prompt


def test_a_decision_only_batch_is_asked_as_before() -> None:
    (system, _prompt) = reflector_messages(version_number=None, entries=[], log=[], traces=[])
    assert "runs of an agent" not in system["content"]


def test_a_change_citing_a_run_makes_a_rule_that_keeps_the_run_as_its_source(
    user: Any, llm_answer: LLMAnswer
) -> None:
    queue = QueueFactory(members=[user], reward_threshold=0.5)
    lost = ranked_decision(queue, user, pick_first=False)
    run = _run(queue, "a", "Refund my order")
    _corrected(run, "Ask before refunding")
    proposal = services.proposal_start(queue_id=queue.pk)
    assert (proposal.decisions, proposal.runs) == ([lost.pk], [str(run.pk)])
    # Numbered in the prompt: the decision is 1, the run 2.
    llm_answer(
        json.dumps(
            {
                "mutations": [
                    {
                        "op": "add",
                        "entry": "",
                        "section": "Refunds",
                        "text": "Ask the customer before refunding an order.",
                        "cites": [2],
                        "why": "the refund was corrected",
                    }
                ]
            }
        )
    )
    proposal = services.proposal_reflect(proposal_id=proposal.pk)
    (mutation,) = proposal.mutations.all()
    assert (mutation.cites, mutation.cites_runs) == ([], [str(run.pk)])
    assert "none has a corrected step with its call logged" in proposal.notes
    curator = UserFactory()
    member_add(queue, curator, "curator")
    client = Client()
    client.force_login(curator)
    page = client.get(f"/q/{queue.slug}/playbook/proposals/").content.decode()
    run_page = f'href="/q/{queue.slug}/trajectories/{run.pk}/"'
    assert "1 decision (" in page and "and 1 agent run (" in page
    assert page.count(run_page) == 2  # read, and cited by the change
    services.mutation_decide(queue=queue, mutation_id=mutation.pk, approve=True, actor=curator)
    made = services.proposal_apply(queue=queue, proposal_id=proposal.pk, actor=curator)
    assert made is not None
    (rule,) = made.entries.all()
    assert (rule.sources, rule.run_sources) == ([], [str(run.pk)])
    assert "from 1 agent run" in client.get(f"/q/{queue.slug}/playbook/").content.decode()
    with pytest.raises(Exception, match="Nothing new"):
        services.proposal_start(queue_id=queue.pk)  # the run was read


TOOLS = [
    {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}
    for name in ("look_up_order", "refund")
]


def _logged_run(queue: Any, key: str, goal: str) -> Trajectory:
    """`_run`, each step with the gateway's call logged (its conversation and tools)."""
    steps = [
        ([{"role": "user", "content": goal}], LOOK_UP),
        (
            [
                {"role": "user", "content": goal},
                {"role": "assistant", "content": None, "tool_calls": [LOOK_UP]},
                {"role": "tool", "tool_call_id": "call_1", "content": "delivered"},
            ],
            REFUND,
        ),
    ]
    for messages, action in steps:
        call = Call.objects.create(
            queue=queue,
            source=Call.Source.MODEL,
            memory=Call.Memory.EMPTY,
            context=messages,
            options={"tools": TOOLS},
        )
        recorded = agent_step(queue, messages, key=key, tool_calls=[action], call_id=call.pk)
    return recorded.trajectory


def test_a_proposal_is_replayed_at_its_runs_corrected_steps_and_at_accepted_steps(
    user: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    queue = QueueFactory(members=[user], reward_threshold=0.5)
    accepted = _logged_run(queue, "b", "Refund order 7")  # nothing weak: its steps succeeded
    corrected = _logged_run(queue, "a", "Refund my order 4821")
    _corrected(corrected, "Ask before refunding")
    proposal = services.proposal_start(queue_id=queue.pk)
    assert (proposal.decisions, proposal.runs) == ([], [str(corrected.pk)])
    mutation = {
        "op": "add",
        "entry": "",
        "section": "Refunds",
        "text": "Ask the customer before refunding an order.",
        "cites": [1],
        "why": "the refund was corrected",
    }
    replayed: list[dict[str, Any]] = []
    real = llm.complete

    def scripted(**kwargs: Any) -> Any:
        """The reflector's change; then, asked again with it, the corrected step asks first
        (the correction), the accepted run refunds as before but no longer looks up."""
        if "options" not in kwargs:
            return real(**kwargs, mock_response=json.dumps({"mutations": [mutation]}))
        replayed.append(kwargs)
        messages = kwargs["messages"]
        if "4821" in messages[1]["content"]:
            answer = "Shall I refund order 4821?"
        elif messages[-1]["role"] == "tool":
            answer = '{"name": "refund", "arguments": {"order_id": "4821"}}'
        else:
            answer = "Which order?"
        return real(**kwargs, mock_response=answer)

    monkeypatch.setattr(llm, "complete", scripted)
    proposal = services.proposal_reflect(proposal_id=proposal.pk)

    assert proposal.status == proposal.Status.OPEN
    # The corrected step is fixed; of the accepted run's two steps, one is broken.
    assert (proposal.replay_fixed, proposal.replay_failures) == (1, 1)
    assert (proposal.replay_broke, proposal.replay_successes) == (1, 2)
    assert "fixes 1 of 1 corrected steps, breaks 1 of 2 accepted ones" in proposal.notes
    assert str(accepted.pk) not in proposal.runs  # not read: only its steps replayed
    assert len(replayed) == 3
    for asked in replayed:
        assert asked["options"] == {"tools": TOOLS}
        system = asked["messages"][0]["content"]
        assert "The playbook (version draft)" in system
        assert "Ask the customer before refunding an order." in system


@pytest.mark.parametrize(
    ("decisions", "runs", "taken"),
    [(20, 3, (7, 3)), (2, 20, (2, 8)), (20, 20, (5, 5)), (0, 4, (0, 4)), (0, 0, (0, 0))],
)
def test_a_batch_takes_half_decisions_half_runs_and_what_one_side_leaves(
    decisions: int, runs: int, taken: tuple[int, int]
) -> None:
    assert services._batch_share(decisions, runs, 10) == taken
