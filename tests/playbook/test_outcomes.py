"""A reviewed generation counts on the playbook entries its prompt carried: whether the
ranking's first candidate was taken as it was. The decision names the version the reviewer
saw beside the item."""

from typing import Any

import pytest

from icrlhf.review.decisions import decision_record, decision_undo
from tests.factories import ItemFactory, playbook_write, ready_generation

pytestmark = pytest.mark.django_db


def _generation(queue: Any, version: Any) -> tuple[Any, list[Any]]:
    item = ItemFactory(queue=queue, input_text="Where is my card?")
    generation = ready_generation(item, ["first", "second"])
    generation.playbook = version
    generation.save(update_fields=["playbook"])
    candidates = list(generation.candidates.order_by("position"))
    for rank, candidate in enumerate(candidates, start=1):
        candidate.rank = rank
        candidate.save(update_fields=["rank"])
    return item, candidates


def test_taking_the_first_counts_for_the_entries_and_an_undo_takes_it_back(
    queue: Any, user: Any
) -> None:
    version = playbook_write(queue, [("Tone", "Be brief.")])
    item, candidates = _generation(queue, version)
    later = playbook_write(queue, [("Tone", "Be brief."), ("Tone", "Say sorry once.")])
    decision = decision_record(
        item_id=item.pk, reviewer=user, verdict="chosen", candidate_id=candidates[0].pk
    )
    entry = version.entries.get()
    entry.refresh_from_db()
    assert (entry.first_chosen, entry.first_not_chosen) == (1, 0)
    # The generation's prompt held only version 1's entry; the reviewer saw version 2.
    assert later.entries.get(text="Say sorry once.").first_chosen == 0
    assert decision.guideline_version == 2

    decision_undo(decision_id=decision.pk, reviewer=user)
    entry.refresh_from_db()
    assert (entry.first_chosen, entry.first_not_chosen) == (0, 0)

    decision_record(item_id=item.pk, reviewer=user, verdict="chosen", candidate_id=candidates[1].pk)
    entry.refresh_from_db()
    assert (entry.first_chosen, entry.first_not_chosen) == (0, 1)


def test_without_a_playbook_the_decision_names_version_zero(queue: Any, user: Any) -> None:
    item, candidates = _generation(queue, None)
    decision = decision_record(item_id=item.pk, reviewer=user, verdict="none_acceptable")
    assert decision.guideline_version == 0
