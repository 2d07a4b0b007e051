"""Retrieval (memory/selectors.py, `examples_recall`): similar preferred answers only, pinned
first and retired never, no near-duplicates, whole examples within the token budget, the
queue's minimum similarity (and what it left out), rejected answers as votes against, and
never another queue's rows. Against the real embedder (fastembed) and a real Qdrant local
store."""

from pathlib import Path
from typing import Any

import pytest

from icrlhf.integrations import vectors
from icrlhf.memory import index
from icrlhf.memory.models import Example
from icrlhf.memory.selectors import examples_recall
from tests.factories import QueueFactory, decided_and_indexed

pytestmark = pytest.mark.django_db


def retrieve(queue: Any, query: str, k: int = 5, budget: int = 10_000) -> list[str]:
    return [
        r.example.output_text
        for r in examples_recall(queue=queue, query_text=query, k=k, token_budget=budget).examples
    ]


def test_retrieval_finds_similar_preferred_answers_only(
    queue: Any, user: Any, vector_store: Path
) -> None:
    decided_and_indexed(
        queue, user, "My card has not arrived yet.", "It ships in 3 days.", "Buy a new one."
    )
    decided_and_indexed(
        queue, user, "How do I reset my PIN?", "Use the app's security tab.", "Call us."
    )
    found = retrieve(queue, "I still haven't received my card", k=1)
    assert found == ["It ships in 3 days."]
    assert "Buy a new one." not in retrieve(queue, "I still haven't received my card")


def test_unrelated_examples_below_the_similarity_floor_are_not_retrieved(
    queue: Any, user: Any, vector_store: Path
) -> None:
    queue.min_similarity = 0.5
    decided_and_indexed(queue, user, "How do I reset my PIN?", "Use the app's security tab.")
    assert retrieve(queue, "What is the weather like on Mars?") == []


def test_pinned_examples_come_first_and_retired_never(
    queue: Any, user: Any, vector_store: Path
) -> None:
    decided_and_indexed(queue, user, "My card has not arrived yet.", "closest")
    pinned = decided_and_indexed(queue, user, "Card delivery takes how long?", "pinned one")[0]
    retired = decided_and_indexed(queue, user, "Has my card been sent?", "retired one")[0]
    Example.objects.filter(pk=pinned.pk).update(status=Example.Status.PINNED)
    Example.objects.filter(pk=retired.pk).update(status=Example.Status.RETIRED)
    found = retrieve(queue, "My card has not arrived yet.")
    assert found[0] == "pinned one"
    assert "closest" in found and "retired one" not in found


def test_near_duplicates_are_retrieved_once(queue: Any, user: Any, vector_store: Path) -> None:
    decided_and_indexed(queue, user, "My card has not arrived yet.", "first copy")
    decided_and_indexed(queue, user, "My card has not arrived yet!", "second copy")
    decided_and_indexed(queue, user, "When will my card be delivered?", "different")
    found = retrieve(queue, "My card has not arrived yet.")
    assert len([text for text in found if text.endswith("copy")]) == 1
    assert "different" in found


def test_examples_are_added_whole_until_the_token_budget(
    queue: Any, user: Any, vector_store: Path
) -> None:
    decided_and_indexed(queue, user, "My card has not arrived yet.", "short answer")
    decided_and_indexed(queue, user, "When will my card be delivered?", "long answer " * 200)
    found = retrieve(queue, "My card has not arrived yet.", budget=60)
    assert found == ["short answer"]  # the long one would not fit whole: it is left out


def test_a_neighbourhood_crowded_with_rejected_answers_still_yields_the_preferred_one(
    queue: Any, user: Any, vector_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first, unfiltered search sees only stale points (rejected or retired answers to the
    very same request); the exact filtered search behind it still finds the preferred answer
    to a similar one."""
    for decision in range(3):
        answers = [f"Wrong {decision}.{n}" for n in range(8)]
        decided_and_indexed(queue, user, "My card has not arrived.", *answers)
    Example.objects.filter(role=Example.Role.PREFERRED).update(status=Example.Status.RETIRED)
    index.examples_payload_sync(example_ids=[e.pk for e in Example.objects.all()])
    decided_and_indexed(
        queue, user, "My card has not arrived yet, where is it?", "It ships in 3 days.", "No."
    )
    searches: list[dict[str, Any]] = []
    real_search = vectors.search
    monkeypatch.setattr(
        vectors,
        "search",
        lambda **kwargs: searches.append(kwargs["match"]) or real_search(**kwargs),
    )
    assert retrieve(queue, "My card has not arrived.", k=1) == ["It ships in 3 days."]
    assert searches == [{}, {"queue_id": [queue.pk], "role": ["preferred"], "status": ["active"]}]


CARD = "My card has not arrived yet."


CARD_AGAIN = "I still haven't received my card"  # cosine 0.83 to CARD, 0.39 to PIN


PIN = "How do I reset my PIN?"


def test_examples_below_the_queues_minimum_are_recorded_and_never_used(
    queue: Any, user: Any, vector_store: Path
) -> None:
    queue.min_similarity = 0.5
    decided_and_indexed(queue, user, CARD, "It ships in 3 days.")
    decided_and_indexed(queue, user, PIN, "Use the app's security tab.")
    recall = examples_recall(queue=queue, query_text=CARD_AGAIN, k=5, token_budget=10_000, pool=5)
    assert [r.example.output_text for r in recall.examples] == ["It ships in 3 days."]
    # Not offered as an answer either: the neighbours are what memory candidates and the
    # gateway's answers from memory are drawn from.
    assert [r.example.output_text for r in recall.neighbours] == ["It ships in 3 days."]
    [below] = recall.below_minimum
    assert below.example.output_text == "Use the app's security tab."
    assert 0.3 < below.score < 0.5 and below.rank == 1
    assert recall.minimum == 0.5


def test_the_minimum_similarity_is_each_queues_own(
    queue: Any, user: Any, vector_store: Path
) -> None:
    lenient = QueueFactory(min_similarity=0.2)
    strict = QueueFactory(min_similarity=0.5)
    for each in (lenient, strict):
        decided_and_indexed(each, user, PIN, "Use the app's security tab.")
    assert retrieve(lenient, CARD_AGAIN) == ["Use the app's security tab."]
    assert retrieve(strict, CARD_AGAIN) == []


def test_below_the_minimum_records_only_what_would_have_taken_one_of_the_k_places(
    queue: Any, user: Any, vector_store: Path
) -> None:
    queue.min_similarity = 0.5
    decided_and_indexed(queue, user, CARD, "It ships in 3 days.")
    decided_and_indexed(queue, user, PIN, "Use the app's security tab.")
    recall = examples_recall(queue=queue, query_text=CARD_AGAIN, k=1, token_budget=10_000)
    # The nearer example takes the one place: the weaker one was never going to be used.
    assert [r.example.output_text for r in recall.examples] == ["It ships in 3 days."]
    assert recall.below_minimum == []


def test_a_pinned_example_below_the_minimum_stays_in_the_prompt_but_never_answers(
    queue: Any, user: Any, vector_store: Path
) -> None:
    queue.min_similarity = 0.5
    pinned = decided_and_indexed(queue, user, PIN, "Use the app's security tab.")[0]
    Example.objects.filter(pk=pinned.pk).update(status=Example.Status.PINNED)
    recall = examples_recall(queue=queue, query_text=CARD_AGAIN, k=5, token_budget=10_000, pool=5)
    # A curator pinned it to be in every prompt; its answer is still not a reply to this.
    assert [r.example.pk for r in recall.examples] == [pinned.pk]
    assert recall.neighbours == [] and recall.below_minimum == []


def test_a_default_queue_keeps_an_unrelated_example_out(user: Any, vector_store: Path) -> None:
    """The issue's case: an example at similarity ~0.3 to a request about something else."""
    queue = QueueFactory()
    decided_and_indexed(queue, user, PIN, "TEST EDIT, please ignore")
    assert retrieve(queue, CARD) == []


def test_rejected_answers_of_similar_requests_are_recalled_as_votes_against(
    queue: Any, user: Any, vector_store: Path
) -> None:
    """The ranking counts what reviewers turned down for similar requests: the recall brings
    the nearest active rejected examples beside the preferred neighbours, never a retired
    one, and none unless neighbours were asked for."""
    decided_and_indexed(
        queue, user, "My card has not arrived yet.", "It ships in 3 days.", "Buy a new one."
    )
    decided_and_indexed(
        queue, user, "How do I reset my PIN?", "Use the app's security tab.", "Call us."
    )
    Example.objects.filter(output_text="Call us.").update(status=Example.Status.RETIRED)
    recall = examples_recall(
        queue=queue, query_text="I still haven't received my card", k=2, token_budget=10_000, pool=5
    )
    assert [r.example.output_text for r in recall.rejected] == ["Buy a new one."]
    assert all(r.example.role == Example.Role.REJECTED for r in recall.rejected)
    assert recall.rejected[0].score > 0.5
    assert "Buy a new one." not in [r.example.output_text for r in recall.neighbours]
    without_pool = examples_recall(
        queue=queue, query_text="I still haven't received my card", k=2, token_budget=10_000
    )
    assert without_pool.rejected == []


def test_a_point_whose_row_belongs_to_another_queue_is_never_retrieved(
    queue: Any, user: Any, vector_store: Path
) -> None:
    """The database is the source of truth: a point left in this queue's collection (a store
    shared wrongly, a row moved) is not this queue's example when its row says otherwise."""
    decided_and_indexed(queue, user, CARD, "It ships in 3 days.", "Buy a new one.")
    decided_and_indexed(queue, user, PIN, "Use the app's security tab.", "Call us.")
    assert retrieve(queue, CARD_AGAIN, k=1) == ["It ships in 3 days."]
    Example.objects.filter(output_text="It ships in 3 days.").update(queue=QueueFactory())
    assert "It ships in 3 days." not in retrieve(queue, CARD_AGAIN)
    assert retrieve(queue, PIN, k=1) == ["Use the app's security tab."]
