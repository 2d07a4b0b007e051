"""Ranking a finished generation: features read off memory and the other candidates, the
order and confidence stored (with the real embedding model for relevance)."""

import math
from dataclasses import replace
from typing import Any

import pytest

from icrlhf.generation import ranking
from icrlhf.generation.models import Calibration, Candidate
from icrlhf.generation.ranking import FEATURES, MEMORY_FEATURES, Neighbour, features_of
from icrlhf.integrations import embeddings
from icrlhf.kinds.labels import answer_key
from tests.factories import DecisionFactory, ItemFactory, ready_generation

pytestmark = pytest.mark.django_db

CARD, PIN = answer_key("card_arrival"), answer_key("pin_blocked")


def test_answers_that_differ_only_in_case_and_spacing_are_the_same() -> None:
    assert answer_key("  Card_arrival \n") == answer_key("card_arrival")
    assert answer_key("card arrival") != answer_key("card_arrival")


def test_features_weigh_near_neighbours_far_more_than_distant_ones() -> None:
    neighbours = [Neighbour(0.9, CARD), Neighbour(0.5, PIN), Neighbour(0.5, PIN)]
    card = features_of(
        key=CARD,
        relevance=0.4,
        from_memory=True,
        neighbours=neighbours,
        other_keys=[PIN, CARD],
        stored=99,
    )
    assert card["vote"] == pytest.approx(0.9**4 / (0.9**4 + 2 * 0.5**4))
    assert card["vote"] > 0.8  # one close vote outweighs two distant ones
    assert (card["support"], card["nearest"], card["agree"], card["memory"]) == (0.9, 0.9, 0.5, 1)
    assert card["knowledge"] == pytest.approx(4.605, abs=1e-3)
    unknown = features_of(
        key=answer_key("something new"),
        relevance=0.1,
        from_memory=False,
        neighbours=[],
        other_keys=[],
        stored=0,
    )
    assert unknown == dict.fromkeys(FEATURES, 0.0) | {"relevance": 0.1}


def _generation(queue: Any, texts: list[str], neighbours: list[tuple[float, str]]) -> Any:
    item = ItemFactory(queue=queue, input_text="My new card has not arrived yet")
    generation = ready_generation(item, texts)
    generation.neighbours = [{"score": s, "answer_key": answer_key(t)} for s, t in neighbours]
    generation.stored_examples = 40
    generation.save()
    return generation


def test_uncalibrated_ranking_puts_memorys_answer_first_and_shows_no_confidence(
    queue: Any,
) -> None:
    generation = _generation(
        queue,
        ["pin_blocked", "exchange_rate", "card_arrival"],
        [(0.92, "card_arrival"), (0.85, "card_arrival"), (0.6, "pin_blocked")],
    )
    assert ranking.generation_rank(generation_id=generation.pk)
    ranked = list(generation.candidates.order_by("position"))
    assert [c.text for c in ranked] == ["card_arrival", "pin_blocked", "exchange_rate"]
    assert all(c.confidence is None for c in ranked)
    assert ranked[0].ranking_features["vote"] > 0.8
    generation.refresh_from_db()
    assert generation.ranked_at is not None and generation.calibration is None
    assert not ranking.generation_rank(generation_id=generation.pk)  # once only


def test_a_calibrated_queue_gets_confidences_in_the_order_of_the_ranking(queue: Any) -> None:
    calibration = Calibration.objects.create(
        queue=queue,
        features=list(FEATURES),
        coefficients=[-3.0, 6.0] + [0.0] * (len(FEATURES) - 1),  # the vote alone
        top_coefficients=[0.0, 1.0],
        items=50,
        candidates=150,
        accepted_share=0.6,
    )
    generation = _generation(
        queue, ["pin_blocked", "card_arrival"], [(0.9, "card_arrival"), (0.5, "pin_blocked")]
    )
    ranking.generation_rank(generation_id=generation.pk)
    first, second = generation.candidates.order_by("position")
    assert first.text == "card_arrival"
    assert first.confidence > 0.9  # sigmoid(-3 + 6 × its vote share)
    assert second.confidence is None  # the confidence is fitted for the first candidate only
    generation.refresh_from_db()
    assert generation.calibration == calibration


def test_a_decided_generation_keeps_its_numbers(queue: Any) -> None:
    """A decision names its candidate by number: ranking late must not renumber them."""
    generation = _generation(
        queue, ["pin_blocked", "card_arrival"], [(0.9, "card_arrival"), (0.5, "pin_blocked")]
    )
    DecisionFactory(generation=generation)
    ranking.generation_rank(generation_id=generation.pk)
    assert list(generation.candidates.order_by("position").values_list("text", flat=True)) == [
        "pin_blocked",
        "card_arrival",
    ]
    assert all(c.ranking_features for c in Candidate.objects.filter(generation=generation))


def test_a_captured_calls_candidates_keep_their_shuffled_order(queue: Any) -> None:
    """The served answer is judged blind: ranking would put it first (or alone first, when
    the others failed) and give it away. Its ranks are recorded, its order stays."""
    generation = _generation(
        queue, ["pin_blocked", "card_arrival"], [(0.9, "card_arrival"), (0.5, "pin_blocked")]
    )
    Candidate.objects.filter(generation=generation, text="card_arrival").update(served=True)
    ranking.generation_rank(generation_id=generation.pk)
    ranked = list(generation.candidates.order_by("position"))
    assert [c.text for c in ranked] == ["pin_blocked", "card_arrival"]
    assert {c.text: c.rank for c in ranked} == {"card_arrival": 1, "pin_blocked": 2}


def test_without_the_embedding_model_the_ranking_goes_on_without_relevance(
    queue: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    def missing(texts: list[str]) -> list[list[float]]:
        raise embeddings.EmbeddingModelMissing("no model")

    monkeypatch.setattr(embeddings, "embed_texts", missing)
    generation = _generation(
        queue, ["pin_blocked", "card_arrival"], [(0.9, "card_arrival"), (0.5, "pin_blocked")]
    )
    assert ranking.generation_rank(generation_id=generation.pk)
    first = generation.candidates.order_by("position").first()
    assert first is not None and first.text == "card_arrival"
    assert first.ranking_features["relevance"] == 0.0


def test_a_retried_candidate_is_ranked_with_the_others(queue: Any, user: Any) -> None:
    from icrlhf.generation.services import candidate_retry

    generation = _generation(
        queue, ["pin_blocked", "card_arrival"], [(0.9, "card_arrival"), (0.5, "pin_blocked")]
    )
    failed = Candidate.objects.create(generation=generation, position=2, status="failed")
    ranking.generation_rank(generation_id=generation.pk)
    candidate_retry(candidate_id=failed.pk)
    generation.refresh_from_db()
    assert generation.ranked_at is None  # ranked again once the retried one settles


def test_a_blind_item_keeps_its_shuffled_order_and_records_the_ranks(
    queue: Any, logged_in: Any
) -> None:
    """The blind share: ranked as any other, shown in random order without the confidence,
    so the dashboard can tell what the order itself does to reviewers."""
    queue.blind_percent = 100
    queue.save()
    Calibration.objects.create(
        queue=queue,
        features=list(FEATURES),
        coefficients=[-3.0, 6.0] + [0.0] * (len(FEATURES) - 1),
        top_coefficients=[0.0, 1.0],
        items=50,
        candidates=150,
        accepted_share=0.6,
    )
    generation = _generation(
        queue, ["pin_blocked", "card_arrival"], [(0.9, "card_arrival"), (0.5, "pin_blocked")]
    )
    assert ranking.generation_rank(generation_id=generation.pk)
    shown = list(generation.candidates.order_by("position"))
    assert [c.text for c in shown] == ["pin_blocked", "card_arrival"]  # not reordered
    assert [c.rank for c in shown] == [2, 1]
    generation.refresh_from_db()
    assert generation.blind
    page = logged_in.get(f"/items/{generation.item_id}/").content.decode()
    assert "in random order" in page and "likely</span>" not in page

    queue.blind_percent = 0
    queue.save()
    other = _generation(
        queue, ["pin_blocked", "card_arrival"], [(0.9, "card_arrival"), (0.5, "pin_blocked")]
    )
    ranking.generation_rank(generation_id=other.pk)
    assert [(c.text, c.rank) for c in other.candidates.order_by("position")] == [
        ("card_arrival", 1),
        ("pin_blocked", 2),
    ]
    page = logged_in.get(f"/items/{other.item_id}/").content.decode()
    assert "in random order" not in page and "likely</span>" in page


def test_an_intent_queue_votes_on_the_label_an_answer_names(queue: Any) -> None:
    """Two answers worded apart but naming one intent pool their votes; a queue without
    labels compares the words."""
    from icrlhf.kinds import kind_of

    kind = kind_of(queue)
    assert kind.vote_key(text="Card_arrival.", queue=queue) != kind.vote_key(
        text="card_arrival", queue=queue
    )
    queue.categories = ["card_arrival", "pin_blocked"]
    assert kind.vote_key(text="Card_arrival.", queue=queue) == kind.vote_key(
        text="card arrival\nThe customer waits for a card.", queue=queue
    )
    assert kind.vote_key(text="pin_blocked", queue=queue) != kind.vote_key(
        text="card_arrival", queue=queue
    )
    # An answer naming no label is still its own words.
    assert kind.vote_key(text="no idea", queue=queue) == answer_key("no idea")


def test_a_ticket_votes_on_its_category_and_priority_not_its_reply(triage_queue: Any) -> None:
    from icrlhf.kinds import kind_of

    kind = kind_of(triage_queue)
    category = triage_queue.categories[0]

    def key(priority: str, reply: str) -> str:
        text = f'{{"category": "{category}", "priority": "{priority}", "reply": "{reply}"}}'
        return kind.vote_key(text=text, queue=triage_queue)

    assert key("high", "We are on it.") == key("high", "Sorry, looking into it now!")
    assert key("high", "We are on it.") != key("low", "We are on it.")


def test_rejections_of_an_answer_by_similar_requests_count_against_it() -> None:
    neighbours = [
        Neighbour(0.9, CARD),
        Neighbour(0.9, PIN, rejected=True),
        Neighbour(0.8, PIN, rejected=True),
        Neighbour(0.5, PIN),
    ]
    card, pin = (
        features_of(
            key=key,
            relevance=0.0,
            from_memory=True,
            neighbours=neighbours,
            other_keys=[],
            stored=9,
        )
        for key in (CARD, PIN)
    )
    total = 2 * 0.9**4 + 0.8**4 + 0.5**4
    assert pin["against"] == pytest.approx((0.9**4 + 0.8**4) / total)
    assert card["against"] == 0.0
    # Votes for and the coverage read the preferred neighbours only.
    assert card["vote"] == pytest.approx(0.9**4 / (0.9**4 + 0.5**4))
    assert (pin["support"], pin["nearest"]) == (0.5, 0.9)


def test_the_prior_ranks_an_answer_reviewers_rejected_below_a_fresh_one(queue: Any) -> None:
    generation = _generation(queue, ["pin_blocked", "exchange_rate"], [])
    generation.neighbours = [
        {"score": 0.95, "vote_key": answer_key("pin_blocked"), "rejected": True},
        {"score": 0.9, "vote_key": answer_key("card_arrival")},
    ]
    generation.save()
    assert ranking.generation_rank(generation_id=generation.pk)
    first = generation.candidates.order_by("position").first()
    assert first is not None and first.text == "exchange_rate"
    assert first.ranking_features["against"] == 0.0


def test_a_rejected_candidate_meaning_what_its_reviewer_kept_is_no_vote_against_it(
    queue: Any, user: Any, vector_store: Any
) -> None:
    """A decision stores every other candidate as rejected, alike or not: another candidate
    naming the kept intent must not count against that intent for later requests."""
    from icrlhf.kinds import kind_of
    from icrlhf.memory import index
    from icrlhf.memory.selectors import examples_recall
    from icrlhf.review.decisions import decision_record

    queue.categories = ["card_arrival", "pin_blocked"]
    queue.save()
    item = ItemFactory(queue=queue, input_text="My card has not arrived yet.")
    generation = ready_generation(item, ["card_arrival", "Card_arrival.", "pin_blocked"])
    decision = decision_record(
        item_id=item.pk,
        reviewer=user,
        verdict="chosen",
        candidate_id=generation.candidates.get(text="card_arrival").pk,
    )
    index.examples_index(example_ids=[e.pk for e in decision.examples.all()])
    recall = examples_recall(
        queue=queue,
        query_text="My card still has not arrived",
        k=2,
        token_budget=10_000,
        pool=5,
    )
    assert len(recall.rejected) == 2  # both other candidates were stored as rejected
    pin = kind_of(queue).vote_key(text="pin_blocked", queue=queue)
    against = [n.key for n in ranking.neighbours_of(queue=queue, recall=recall) if n.rejected]
    assert against == [pin]
    # Without its preferred sibling among the neighbours, the kept answer is looked up.
    alone = replace(recall, neighbours=[])
    assert [n.key for n in ranking.neighbours_of(queue=queue, recall=alone) if n.rejected] == [pin]


def test_memory_alone_serves_the_answer_voted_for_and_not_rejected() -> None:
    """The gateway's choice among the answers memory can give: the memory-only fit's best,
    with its confidence."""
    coefficients = [0.0] * (len(MEMORY_FEATURES) + 1)
    coefficients[1 + MEMORY_FEATURES.index("vote")] = 4.0
    coefficients[1 + MEMORY_FEATURES.index("against")] = -8.0
    fit = {"features": list(MEMORY_FEATURES), "coefficients": coefficients, "platt": [0.0, 1.0]}
    neighbours = [Neighbour(0.9, PIN), Neighbour(0.9, CARD), Neighbour(0.95, PIN, rejected=True)]
    best = ranking.memory_vote_best(
        keys=[PIN, CARD], neighbours=neighbours, stored=10, memory_fit=fit | {"isotonic": None}
    )
    assert best is not None and best[0] == CARD
    assert best[1] == pytest.approx(1 / (1 + math.exp(-2.0)))  # sigmoid(4 × half the votes)
    assert (
        ranking.memory_vote_best(keys=[], neighbours=neighbours, stored=10, memory_fit=fit) is None
    )


def test_a_generation_retrieved_before_votes_were_keyed_by_the_kind_is_ranked_on_words(
    queue: Any,
) -> None:
    queue.categories = ["card_arrival", "pin_blocked"]
    queue.save()
    generation = _generation(
        queue, ["pin_blocked", "card_arrival"], [(0.9, "card_arrival"), (0.5, "pin_blocked")]
    )  # stored as {score, answer_key}
    assert ranking.generation_rank(generation_id=generation.pk)
    first = generation.candidates.order_by("position").first()
    assert first is not None and first.text == "card_arrival"
    assert first.ranking_features["vote"] > 0.8
