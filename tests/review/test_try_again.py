"""In-context RL on the review side ("Reward is Enough"): a reviewer's ratings stored as the
examples' rewards, "try again" rounds written with the earlier attempts and their rewards in
view, and rewards beside retrieved examples. The prompt is built by the real pipeline with the
real embedder and Qdrant local store."""

from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.test import Client

from icrlhf.generation import pipeline
from icrlhf.generation.models import Candidate, Generation
from icrlhf.generation.prompts import EXPLORE_OR_EXPLOIT, REWARDED_PREAMBLE
from icrlhf.generation.services import item_create
from icrlhf.memory import index as memory_index
from icrlhf.memory.models import Example
from icrlhf.queues.models import Item
from icrlhf.review.decisions import decision_record
from icrlhf.review.models import Decision
from tests.factories import ItemFactory, QueueFactory, UserFactory, ready_generation

pytestmark = pytest.mark.django_db


def candidates_of(generation: Generation) -> list[Candidate]:
    return list(generation.candidates.order_by("position"))


def rewards_stored(item: Item) -> list[tuple[str, float, str]]:
    return sorted(
        (e.role, e.reward, e.output_text) for e in Example.objects.filter(decision__item=item)
    )


def test_ratings_become_the_rewards_of_what_the_decision_stores(queue: Any, user: Any) -> None:
    item = ItemFactory(queue=queue)
    first, second, third = candidates_of(ready_generation(item, ["a", "b", "c"]))
    decision = decision_record(
        item_id=item.pk,
        reviewer=user,
        verdict="chosen",
        candidate_id=second.pk,
        ratings={first.pk: 2, second.pk: 4},
    )
    assert decision.ratings == {str(first.pk): 2, str(second.pk): 4}
    assert rewards_stored(item) == [
        ("preferred", 0.75, "b"),
        ("rejected", 0.0, "c"),  # not rated: rejected
        ("rejected", 0.25, "a"),
    ]


def test_a_rating_out_of_range_or_for_another_round_saves_nothing(queue: Any, user: Any) -> None:
    item = ItemFactory(queue=queue)
    (candidate,) = candidates_of(ready_generation(item, ["a"]))
    elsewhere = candidates_of(ready_generation(ItemFactory(queue=queue), ["x"]))[0]
    for ratings in ({candidate.pk: 6}, {candidate.pk: 0}, {elsewhere.pk: 3}):
        with pytest.raises(ValidationError):
            decision_record(
                item_id=item.pk,
                reviewer=user,
                verdict="chosen",
                candidate_id=candidate.pk,
                ratings=ratings,
            )
    assert not Decision.objects.exists() and not Example.objects.exists()


def test_the_page_posts_ratings_and_a_bad_one_gets_a_sentence(
    queue: Any, logged_in: Client
) -> None:
    item = ItemFactory(queue=queue)
    first, second = candidates_of(ready_generation(item, ["a", "b"]))
    page = logged_in.get(f"/items/{item.pk}/").content.decode()
    assert f'name="rating_{first.pk}"' in page and '<option value="5">5 · best</option>' in page

    refused = logged_in.post(
        f"/items/{item.pk}/decide/",
        {"choice": f"c{first.pk}", f"rating_{first.pk}": "five"},
        follow=True,
    )
    assert "Ratings: A rating is a whole number from 1 to 5. Nothing was saved." in (
        refused.content.decode()
    )
    assert not Decision.objects.exists()

    odd = logged_in.post(
        f"/items/{item.pk}/decide/",
        {"choice": f"c{first.pk}", f"rating_{first.pk}": "²"},  # a digit to str.isdigit()
        follow=True,
    )
    assert odd.status_code == 200 and "A rating is a whole number" in odd.content.decode()
    contrary = logged_in.post(
        f"/items/{item.pk}/decide/",
        {"choice": f"c{first.pk}", f"rating_{first.pk}": "2", f"rating_{second.pk}": "4"},
        follow=True,
    )
    assert "You rated another candidate higher than the one you picked" in (
        contrary.content.decode()
    )
    assert not Decision.objects.exists()

    logged_in.post(
        f"/items/{item.pk}/decide/",
        {"choice": f"c{first.pk}", f"rating_{first.pk}": "5", f"rating_{second.pk}": ""},
    )
    assert Decision.objects.get().ratings == {str(first.pk): 5}


def test_try_again_writes_the_next_round_with_the_attempts_and_their_rewards(
    queue: Any, user: Any, logged_in: Client, vector_store: Path
) -> None:
    queue.reason_tags = ["wrong facts"]
    queue.save()
    item = ItemFactory(queue=queue, input_text="When does my card ship?")
    round_one = ready_generation(item, ["Ships Monday.", "Ships never."])
    monday, never = candidates_of(round_one)
    logged_in.get(f"/items/{item.pk}/")  # opening it claims it

    response = logged_in.post(
        f"/items/{item.pk}/try-again/",
        {f"rating_{monday.pk}": "3", "reason_tags": "wrong facts", "comment": "The real date."},
        follow=True,
    )
    assert "Trying again" in response.content.decode()
    page = response.content.decode()
    assert "round 2 (after 1 round sent back with “try again”)" in page
    # Round 1 stays on the page, folded, with how each answer went back.
    assert "Round 1: 2 answers sent back by" in page and "wrong facts" in page
    assert "rated, reward 0.50" in page and "not rated (sent back as rejected, reward 0.00)" in page
    assert "Ships never." in page and "“The real date.”" in page
    round_one.refresh_from_db()
    assert round_one.try_again == {
        "rewards": {str(monday.pk): 0.5},
        "reasons": ["wrong facts"],
        "comment": "The real date.",
        "reviewer": user.username,
    }
    round_two = item.generations.order_by("-created_at").first()
    assert round_two is not None and round_two != round_one

    pipeline.generation_prepare(generation_id=round_two.pk)
    round_two.refresh_from_db()
    system = round_two.messages[0]["content"]
    assert "<attempt>\n<response>\nShips Monday.\n</response>\n<reward>0.50</reward>" in system
    assert "<attempt>\n<response>\nShips never.\n</response>\n<reward>0.00</reward>" in system
    assert "Feedback on them: wrong facts — The real date." in system
    assert system.endswith(EXPLORE_OR_EXPLOIT)
    assert round_two.messages[-1] == {"role": "user", "content": "When does my card ship?"}

    # The new round decided: its pick is preferred, the answers sent back are rejected with
    # the rewards they were given.
    Candidate.objects.filter(generation=round_two).update(status="done", text="Ships Friday.")
    Item.objects.filter(pk=item.pk).update(status=Item.Status.READY)
    picked = candidates_of(round_two)[0]
    decision_record(item_id=item.pk, reviewer=user, verdict="chosen", candidate_id=picked.pk)
    stored = rewards_stored(item)
    assert ("preferred", 1.0, "Ships Friday.") in stored
    assert ("rejected", 0.5, "Ships Monday.") in stored
    assert ("rejected", 0.0, "Ships never.") in stored


def test_a_stale_page_cannot_send_back_a_round_it_did_not_show(
    queue: Any, logged_in: Client
) -> None:
    item = ItemFactory(queue=queue)
    (shown,) = candidates_of(ready_generation(item, ["a"]))
    newer = ready_generation(item, ["b"])  # regenerated since the page was loaded
    response = logged_in.post(
        f"/items/{item.pk}/try-again/", {"shown_candidates": str(shown.pk)}, follow=True
    )
    assert "Your page did not show this item" in response.content.decode()
    newer.refresh_from_db()
    assert newer.try_again is None and item.generations.count() == 2


def test_an_answer_sent_back_twice_is_remembered_once_with_its_latest_reward(
    queue: Any, user: Any
) -> None:
    from icrlhf.review.claims import item_try_again

    item = ItemFactory(queue=queue)
    for texts, ratings in ((["never", "monday"], (1, 3)), (["never", "friday"], (2, 1))):
        generation = ready_generation(item, texts)
        Generation.objects.filter(pk=generation.pk).update(status=Generation.Status.DONE)
        Item.objects.filter(pk=item.pk).update(status=Item.Status.READY)
        candidates = candidates_of(generation)
        item_try_again(
            item_id=item.pk,
            reviewer=user,
            ratings={c.pk: r for c, r in zip(candidates, ratings, strict=True)},
            reasons=[],
            comment="",
        )
        item.generations.order_by("-pk").first().delete()  # stand-in for the worker's round
    last = ready_generation(item, ["friday", "tuesday"])
    Item.objects.filter(pk=item.pk).update(status=Item.Status.READY)
    decision_record(
        item_id=item.pk,
        reviewer=user,
        verdict="chosen",
        candidate_id=candidates_of(last)[1].pk,
    )
    assert rewards_stored(item) == [
        ("preferred", 1.0, "tuesday"),
        ("rejected", 0.0, "friday"),  # the decided round's, stored once
        ("rejected", 0.25, "never"),  # its latest reward
        ("rejected", 0.5, "monday"),
    ]


def test_try_again_is_for_the_queues_reviewers_only(queue: Any, user: Any) -> None:
    item = ItemFactory(queue=queue)
    ready_generation(item, ["a"])
    viewer, stranger = UserFactory(), UserFactory()
    QueueFactory(members=[stranger])
    queue.membership_set.create(user=viewer, role="viewer")
    for person, status in ((stranger, 404), (viewer, 403)):
        client = Client()
        client.force_login(person)
        assert client.post(f"/items/{item.pk}/try-again/", {}).status_code == status
    assert item.generations.count() == 1
    assert Client().post(f"/items/{item.pk}/try-again/", {}).status_code == 302  # log in


def test_a_memory_answer_sent_back_is_not_offered_again(
    queue: Any, user: Any, vector_store: Path
) -> None:
    queue.memory_candidates = 1
    queue.save()
    remembered = ItemFactory(queue=queue, input_text="Where is my card?")
    kept = decision_record(
        item_id=remembered.pk,
        reviewer=user,
        verdict="chosen",
        candidate_id=candidates_of(ready_generation(remembered, ["In the post."]))[0].pk,
    )
    memory_index.examples_index(example_ids=[e.pk for e in kept.examples.all()])
    item = item_create(queue=queue, input_text="Where is my card?", created_by=user, n_candidates=2)
    round_one = item.generations.get()
    pipeline.generation_prepare(generation_id=round_one.pk)
    assert Candidate.objects.filter(generation=round_one, source="memory").count() == 1
    Candidate.objects.filter(generation=round_one).update(status="done", text="In the post.")
    Item.objects.filter(pk=item.pk).update(status=Item.Status.READY)
    Generation.objects.filter(pk=round_one.pk).update(status=Generation.Status.DONE)

    from icrlhf.review.claims import item_try_again

    round_two = item_try_again(item_id=item.pk, reviewer=user, ratings={}, reasons=[], comment="")
    pipeline.generation_prepare(generation_id=round_two.pk)
    assert not Candidate.objects.filter(generation=round_two, source="memory").exists()


def test_rewards_beside_examples_show_the_rejected_rivals_with_theirs(
    user: Any, vector_store: Path
) -> None:
    queue = QueueFactory(members=[user], example_rewards=True, memory_candidates=0)
    remembered = ItemFactory(queue=queue, input_text="Where is my card?")
    right, near, wrong = candidates_of(
        ready_generation(remembered, ["In the post.", "In the post soon.", "No idea."])
    )
    kept = decision_record(
        item_id=remembered.pk,
        reviewer=user,
        verdict="chosen",
        candidate_id=right.pk,
        ratings={near.pk: 3},
    )
    memory_index.examples_index(example_ids=[e.pk for e in kept.examples.all()])
    item = item_create(queue=queue, input_text="Where is my card now?", created_by=user)
    generation = item.generations.get()
    pipeline.generation_prepare(generation_id=generation.pk)
    generation.refresh_from_db()
    system = generation.messages[0]["content"]
    assert REWARDED_PREAMBLE in system
    # Lowest reward first, the preferred answer last, nearest the request.
    assert (
        "<request>\nWhere is my card?\n</request>\n"
        '<answer reward="0.00">\nNo idea.\n</answer>\n'
        '<answer reward="0.50">\nIn the post soon.\n</answer>\n'
        '<answer reward="1.00">\nIn the post.\n</answer>'
    ) in system
