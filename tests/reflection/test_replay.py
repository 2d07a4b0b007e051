"""A proposal is tried before a curator sees it: the batch's failures and a sample of past
successes answered again with the draft playbook, scored as the queue scores."""

import json
from typing import Any

import pytest

from icrlhf.generation.prompts import playbook_block
from icrlhf.integrations import llm
from icrlhf.playbook.models import Entry
from icrlhf.reflection import services
from icrlhf.reflection.models import Mutation, Proposal
from icrlhf.reflection.replay import draft_text, with_playbook
from tests.factories import QueueFactory, UserFactory, playbook_write, ranked_decision

pytestmark = pytest.mark.django_db


def test_the_draft_is_the_playbook_with_every_change_in_place_of_the_old_block() -> None:
    entries = [
        Entry(key=1, section="Tone", text="Be brief."),
        Entry(key=2, section="Cards", text="Ask for the last four."),
    ]
    mutations = [
        Mutation(op="edit", key=1, section="Tone", text="Be brief and kind."),
        Mutation(op="retire", key=2),
        Mutation(op="add", section="Cards", text="Offer to freeze a lost card."),
    ]
    draft = draft_text(entries, mutations)
    assert draft == "Cards:\n- Offer to freeze a lost card.\nTone:\n- Be brief and kind."
    old = playbook_block(3, "Tone:\n- Be brief.")
    sent = [
        {"role": "system", "content": f"Be helpful.\n\n{old}\n\nExamples…"},
        {"role": "user", "content": "Lost my card"},
    ]
    new = playbook_block("draft", draft)
    swapped = with_playbook(sent, old=old, new=new)
    assert swapped[0]["content"] == f"Be helpful.\n\n{new}\n\nExamples…" and swapped[1] == sent[1]
    # A prompt that carried no playbook gets the draft after its system prompt.
    bare = [{"role": "system", "content": "Be helpful.\n\nExamples…"}, sent[1]]
    assert (
        with_playbook(bare, old="", new=new)[0]["content"] == f"Be helpful.\n\n{new}\n\nExamples…"
    )


def test_a_label_queues_replay_counts_fixes_and_breaks(monkeypatch: pytest.MonkeyPatch) -> None:
    reviewer = UserFactory()
    queue = QueueFactory(members=[reviewer], categories=["Call us.", "Order a new card."])
    playbook_write(queue, [("Tone", "Be brief.")])
    kept = ranked_decision(queue, reviewer, pick_first=True)  # "Order a new card." won
    lost = ranked_decision(queue, reviewer, pick_first=False)  # "Call us." was preferred
    for decision in (kept, lost):
        decision.generation.messages = [
            {"role": "system", "content": "Be helpful."},
            {"role": "user", "content": decision.item.input_text},
        ]
        decision.generation.save(update_fields=["messages"])
    proposal = services.proposal_start(queue_id=queue.pk)
    assert proposal.decisions == [lost.pk]
    answer = {
        "mutations": [
            {
                "op": "add",
                "entry": "",
                "section": "Cards",
                "text": "Offer a call back.",
                "cites": [1],
                "why": "",
            }
        ]
    }
    # The reflector answers the mutation; each replayed request then answers "Call us.", as
    # litellm's offline switch says (its real code path runs).
    calls = iter([json.dumps(answer), "Call us.", "Call us."])
    real = llm.complete

    def scripted(**kwargs: Any) -> Any:
        return real(**{**kwargs, "mock_response": next(calls)})

    monkeypatch.setattr(llm, "complete", scripted)
    proposal = services.proposal_reflect(proposal_id=proposal.pk)
    assert proposal.status == Proposal.Status.OPEN
    assert (proposal.replay_fixed, proposal.replay_failures) == (1, 1)
    assert (proposal.replay_broke, proposal.replay_successes) == (1, 1)
    assert proposal.replay_scored_by == "the label"
