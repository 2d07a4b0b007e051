"""A queue's minimum similarity in the generation pipeline and on the item page: examples
below it are neither in the prompt nor offered as candidates, and the generation records
them so that the reviewer sees what was left out (real embedder and Qdrant local store)."""

import json
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from icrlhf.generation import pipeline
from icrlhf.generation.models import Candidate, Generation
from icrlhf.generation.selectors import generation_retrievals
from icrlhf.generation.services import item_create
from icrlhf.memory import index as memory_index
from icrlhf.memory.models import Example
from icrlhf.review.decisions import decision_record
from tests.factories import ItemFactory, ready_generation

pytestmark = pytest.mark.django_db

CARD = "My card has not arrived yet."
CARD_AGAIN = "I still haven't received my card"  # cosine 0.83 to CARD, 0.39 to PIN
PIN = "How do I reset my PIN?"
# A reviewer's test edit, with markup: it must never reach an unrelated prompt, and the page
# shows it as text.
TEST_EDIT = "<b>TEST EDIT</b> please ignore"


def remember(queue: Any, user: Any, question: str, answer: str) -> Example:
    item = ItemFactory(queue=queue, input_text=question)
    generation = ready_generation(item, [answer, "a rejected answer"])
    decision = decision_record(
        item_id=item.pk,
        reviewer=user,
        verdict="chosen",
        candidate_id=generation.candidates.get(text=answer).pk,
    )
    memory_index.examples_index(example_ids=[e.pk for e in decision.examples.all()])
    return decision.examples.get(role=Example.Role.PREFERRED)


@pytest.fixture
def prepared(queue: Any, user: Any, vector_store: Path) -> tuple[Generation, Example, Example]:
    """A request about a card, in a queue whose memory holds a near one and an unrelated
    test edit; memory candidates would take any stored answer but for the minimum."""
    queue.min_similarity = 0.5
    queue.memory_candidates, queue.memory_min_similarity = 2, 0.0
    queue.save()
    near = remember(queue, user, CARD, "It ships in 3 days.")
    unrelated = remember(queue, user, PIN, TEST_EDIT)
    item = item_create(queue=queue, input_text=CARD_AGAIN, created_by=user, n_candidates=3)
    pipeline.generation_prepare(generation_id=item.generations.get().pk)
    return Generation.objects.get(item=item), near, unrelated


def test_an_example_below_the_minimum_is_not_in_the_prompt_nor_a_candidate(
    prepared: tuple[Generation, Example, Example],
) -> None:
    generation, near, unrelated = prepared
    assert "It ships in 3 days." in json.dumps(generation.messages)
    assert "TEST EDIT" not in json.dumps(generation.messages)
    assert [r.example_id for r in generation.retrievals.all()] == [near.pk]
    offered = generation.candidates.filter(source=Candidate.Source.MEMORY)
    assert [c.text for c in offered] == ["It ships in 3 days."]
    assert "TEST EDIT" not in "".join(generation.candidates.values_list("text", flat=True))


def test_the_generation_records_what_fell_below_the_minimum(
    prepared: tuple[Generation, Example, Example],
) -> None:
    generation, near, unrelated = prepared
    assert generation.min_similarity == 0.5
    [below] = generation.below_minimum
    assert below["example"] == str(unrelated.pk) and 0.3 < below["score"] < 0.5

    retrievals = generation_retrievals(generation=generation)
    assert [r.example for r in retrievals.used] == [near]
    assert [(b.example, round(b.score, 6)) for b in retrievals.below_minimum] == [
        (unrelated, round(below["score"], 6))
    ]
    assert retrievals.minimum == 0.5


def test_an_example_deleted_since_is_no_longer_listed_below_the_minimum(
    prepared: tuple[Generation, Example, Example],
) -> None:
    generation, _, unrelated = prepared
    unrelated.delete()
    assert generation_retrievals(generation=generation).below_minimum == []


def test_the_item_page_shows_the_examples_used_and_those_below_the_minimum(
    prepared: tuple[Generation, Example, Example], logged_in: Client
) -> None:
    generation, _, _ = prepared
    page = logged_in.get(f"/items/{generation.item_id}/").content.decode()
    why = page[page.index('id="why-heading"') :]
    assert "Minimum similarity 0.50" in why and "1 fell below it" in why
    scroll = why[why.index('<div class="table-scroll">') :]
    table = scroll[: scroll.index("</table>")]
    assert table.count('class="retrieval-used"') == 1
    assert "It ships in 3 days." in table
    assert table.count('class="retrieval-below-minimum muted"') == 1
    assert "No: below the minimum 0.50" in table
    # The stored text is shown as text, never as markup.
    assert "&lt;b&gt;TEST EDIT&lt;/b&gt; please ignore" in table and "<b>TEST EDIT" not in page


def test_when_nothing_is_similar_enough_the_page_says_so(
    queue: Any, user: Any, vector_store: Path, logged_in: Client
) -> None:
    queue.min_similarity = 0.9
    queue.save()
    remember(queue, user, PIN, "Use the app's security tab.")
    item = item_create(queue=queue, input_text=CARD_AGAIN, created_by=user)
    pipeline.generation_prepare(generation_id=item.generations.get().pk)
    page = logged_in.get(f"/items/{item.pk}/").content.decode()
    assert "No stored example was similar enough to be used for this item." in page
    assert "Use the app&#x27;s security tab." in page
    assert not Generation.objects.get(item=item).retrievals.exists()


def test_a_generation_without_memory_states_no_minimum(
    queue: Any, user: Any, vector_store: Path, logged_in: Client
) -> None:
    item = item_create(queue=queue, input_text=CARD_AGAIN, created_by=user)
    page = logged_in.get(f"/items/{item.pk}/").content.decode()
    why = page[page.index('id="why-heading"') :]
    why = why[: why.index("</section>")]
    # Not prepared yet: nothing was retrieved, so no minimum was applied.
    assert "Minimum similarity" not in why and "table-scroll" not in why
    assert "No stored example was retrieved for this item yet." in why
