import re
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from icrlhf.generation import pipeline, recovery, tasks
from icrlhf.generation.models import Candidate, Generation
from icrlhf.generation.services import STOPPED_BY_DECISION, candidate_retry, item_create
from icrlhf.integrations import llm
from icrlhf.memory.models import Example
from icrlhf.queues.models import Item
from icrlhf.review.claims import DecisionConflict
from icrlhf.review.decisions import decision_record, decision_undo
from icrlhf.review.models import Decision
from tests.factories import (
    CandidateFactory,
    GenerationFactory,
    ItemFactory,
    UserFactory,
    ready_generation,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def item_with_candidates(queue: Any) -> tuple[Item, list[Any]]:
    item = ItemFactory(queue=queue, input_text="Where is my card?")
    generation = ready_generation(item, ["answer one", "answer two", "answer three"])
    return item, list(generation.candidates.order_by("position"))


def _examples(item: Item) -> list[tuple[str, float, str]]:
    return sorted(
        (e.role, e.reward, e.output_text) for e in Example.objects.filter(decision__item=item)
    )


def test_choosing_rewards_the_choice_and_rejects_the_rest(
    item_with_candidates: Any, user: Any, django_capture_on_commit_callbacks: Any
) -> None:
    item, candidates = item_with_candidates
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        decision = decision_record(
            item_id=item.pk, reviewer=user, verdict="chosen", candidate_id=candidates[1].pk
        )
    assert decision.final_text == "answer two"
    assert _examples(item) == [
        ("preferred", 1.0, "answer two"),
        ("rejected", 0.0, "answer one"),
        ("rejected", 0.0, "answer three"),
    ]
    assert set(Example.objects.values_list("index_state", flat=True)) == {"pending"}
    assert len(callbacks) == 1  # the index task, after commit
    item.refresh_from_db()
    assert item.status == Item.Status.DECIDED


def test_an_edit_is_preferred_over_every_candidate(item_with_candidates: Any, user: Any) -> None:
    item, candidates = item_with_candidates
    decision = decision_record(
        item_id=item.pk,
        reviewer=user,
        verdict="edited",
        candidate_id=candidates[0].pk,
        final_text="  answer one, corrected  ",
    )
    assert decision.verdict == Decision.Verdict.EDITED
    assert decision.chosen_candidate_id == candidates[0].pk
    assert _examples(item) == [
        ("preferred", 1.0, "answer one, corrected"),
        ("rejected", 0.0, "answer one"),
        ("rejected", 0.0, "answer three"),
        ("rejected", 0.0, "answer two"),
    ]
    preferred = Example.objects.get(role="preferred")
    assert preferred.candidate_id == candidates[0].pk


def test_an_unchanged_edit_counts_as_a_pick(item_with_candidates: Any, user: Any) -> None:
    item, candidates = item_with_candidates
    decision = decision_record(
        item_id=item.pk,
        reviewer=user,
        verdict="edited",
        candidate_id=candidates[2].pk,
        final_text="answer three\n",
    )
    assert decision.verdict == Decision.Verdict.CHOSEN


def test_none_acceptable_rejects_every_candidate(item_with_candidates: Any, user: Any) -> None:
    item, _ = item_with_candidates
    decision_record(item_id=item.pk, reviewer=user, verdict="none_acceptable")
    assert [role for role, _, _ in _examples(item)] == ["rejected"] * 3


def test_failed_candidates_are_not_remembered(queue: Any, user: Any) -> None:
    item = ItemFactory(queue=queue)
    generation = ready_generation(item, ["good", "other"])
    generation.candidates.filter(text="other").update(status="failed", text="")
    decision_record(
        item_id=item.pk,
        reviewer=user,
        verdict="chosen",
        candidate_id=generation.candidates.get(text="good").pk,
    )
    assert _examples(item) == [("preferred", 1.0, "good")]


def test_a_second_decision_is_refused_and_nothing_of_it_is_saved(
    item_with_candidates: Any, user: Any
) -> None:
    item, candidates = item_with_candidates
    decision_record(item_id=item.pk, reviewer=user, verdict="chosen", candidate_id=candidates[0].pk)
    with pytest.raises(DecisionConflict, match="already been decided"):
        decision_record(
            item_id=item.pk, reviewer=user, verdict="chosen", candidate_id=candidates[1].pk
        )
    assert Decision.objects.count() == 1
    assert Example.objects.filter(role="preferred").get().output_text == "answer one"


@pytest.mark.parametrize(
    ("verdict", "candidate_index", "final_text", "message"),
    [
        ("chosen", None, "", "Pick a candidate first"),
        ("edited", 0, "   ", "The edited answer is empty"),
        ("bogus", 0, "", "Unknown verdict"),
    ],
)
def test_an_invalid_decision_saves_nothing(
    item_with_candidates: Any,
    user: Any,
    verdict: str,
    candidate_index: int | None,
    final_text: str,
    message: str,
) -> None:
    item, candidates = item_with_candidates
    candidate_id = None if candidate_index is None else candidates[candidate_index].pk
    with pytest.raises(ValidationError, match=message):
        decision_record(
            item_id=item.pk,
            reviewer=user,
            verdict=verdict,
            candidate_id=candidate_id,
            final_text=final_text,
        )
    assert not Decision.objects.exists()
    item.refresh_from_db()
    assert item.status == Item.Status.READY


def test_a_candidate_of_another_item_cannot_be_chosen(queue: Any, user: Any) -> None:
    item = ItemFactory(queue=queue)
    ready_generation(item, ["mine"])
    other = ready_generation(ItemFactory(queue=queue), ["not mine"]).candidates.get()
    with pytest.raises(ValidationError, match="does not belong"):
        decision_record(item_id=item.pk, reviewer=user, verdict="chosen", candidate_id=other.pk)


def test_a_finished_candidate_can_be_picked_while_the_others_are_still_generating(
    queue: Any, user: Any
) -> None:
    item = ItemFactory(queue=queue, status=Item.Status.GENERATING)
    generation = GenerationFactory(item=item, n_candidates=2, status=Generation.Status.RUNNING)
    early = CandidateFactory(generation=generation, position=0, text="early")
    late = CandidateFactory(generation=generation, position=1, status=Candidate.Status.RUNNING)
    with pytest.raises(ValidationError, match="no answer to pick"):
        decision_record(item_id=item.pk, reviewer=user, verdict="chosen", candidate_id=late.pk)

    decision = decision_record(
        item_id=item.pk, reviewer=user, verdict="chosen", candidate_id=early.pk
    )
    assert decision.verdict == "chosen"
    Candidate.objects.filter(pk=late.pk).update(status=Candidate.Status.DONE, text="late")
    pipeline.generation_finish_if_complete(generation_id=generation.pk)
    assert Item.objects.get(pk=item.pk).status == Item.Status.DECIDED  # stays decided


def test_an_item_with_nothing_finished_yet_cannot_be_decided(queue: Any, user: Any) -> None:
    item = ItemFactory(queue=queue, status=Item.Status.GENERATING)
    generation = GenerationFactory(item=item, n_candidates=1, status=Generation.Status.RUNNING)
    CandidateFactory(generation=generation, status=Candidate.Status.RUNNING)
    with pytest.raises(DecisionConflict, match="generating"):
        decision_record(item_id=item.pk, reviewer=user, verdict="none_acceptable")


def test_the_decide_view_saves_and_reports(logged_in: Client, item_with_candidates: Any) -> None:
    item, candidates = item_with_candidates
    cid = candidates[1].pk
    response = logged_in.post(
        f"/items/{item.pk}/decide/",
        {"choice": f"c{cid}", f"final_text_{cid}": "better"},
        follow=True,
    )
    page = response.content.decode()
    assert f"Saved item {item.pk}: edited." in page
    assert Decision.objects.get().final_text == "better"

    again = logged_in.post(
        f"/items/{item.pk}/decide/", {"choice": f"c{candidates[0].pk}"}, follow=True
    )
    assert "already been decided" in again.content.decode()
    assert Decision.objects.count() == 1


def test_the_decide_view_requires_post_and_csrf(item_with_candidates: Any, user: Any) -> None:
    item, candidates = item_with_candidates
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    assert client.get(f"/items/{item.pk}/decide/").status_code == 405
    response = client.post(f"/items/{item.pk}/decide/", {"choice": f"c{candidates[0].pk}"})
    assert response.status_code == 403
    assert not Decision.objects.exists()


def test_a_multi_line_candidate_picked_unchanged_from_a_browser_is_a_pick(
    logged_in: Client, queue: Any
) -> None:
    item = ItemFactory(queue=queue)
    generation = ready_generation(item, ["Line one.\nLine two."])
    cid = generation.candidates.get().pk
    # Browsers post a text box's line breaks as CRLF.
    logged_in.post(
        f"/items/{item.pk}/decide/",
        {"choice": f"c{cid}", f"final_text_{cid}": "Line one.\r\nLine two."},
    )
    decision = Decision.objects.get()
    assert (decision.verdict, decision.final_text) == ("chosen", "Line one.\nLine two.")


def test_a_decision_stops_the_candidates_still_coming(
    queue: Any,
    user: Any,
    llm_answer: Any,
    vector_store: Any,
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
    django_capture_on_commit_callbacks: Any,
) -> None:
    """Deciding an item (none acceptable, here) stops its candidates still waiting, waiting
    for a retry, or generating: their tasks then return without calling the model, an answer
    on its way when the decision came is not saved, and nothing sweeps or retries them."""
    item = item_create(queue=queue, input_text="Where is my card?", created_by=user, n_candidates=4)
    generation = item.generations.get()
    pipeline.generation_prepare(generation_id=generation.pk)
    first, retrying, generating, waiting = generation.candidates.order_by("pk")
    llm_answer("It ships tomorrow.")
    pipeline.candidate_generate(candidate_id=first.pk)
    llm_answer("litellm.RateLimitError")
    with django_capture_on_commit_callbacks(execute=False) as retry:
        pipeline.candidate_generate(candidate_id=retrying.pk)
    assert len(retry) == 1 and Candidate.objects.get(pk=retrying.pk).retry_at is not None
    [on_its_way] = pipeline._candidates_claim([generating.pk])  # its call is in flight

    decision_record(item_id=item.pk, reviewer=user, verdict="none_acceptable")

    asked: list[Any] = []
    monkeypatch.setattr(pipeline.llm, "complete_n", lambda call, n: asked.append(call) or iter(()))
    tasks.candidate_generate.apply(args=[retrying.pk])  # its retry comes due
    tasks.candidates_generate.apply(args=[[waiting.pk]])  # its first message arrives late
    answer = llm.Completion(
        text="Late.", model="m", prompt_tokens=1, completion_tokens=1, cost_usd=0.0, latency_ms=5
    )
    pipeline._candidates_save([(on_its_way, answer)], queue=queue)
    assert asked == []
    stopped = Candidate.objects.filter(pk__in=[retrying.pk, generating.pk, waiting.pk])
    assert {(c.status, c.error, c.text) for c in stopped} == {
        (Candidate.Status.FAILED, STOPPED_BY_DECISION, "")
    }
    assert Candidate.objects.get(pk=first.pk).status == Candidate.Status.DONE
    generation.refresh_from_db()
    assert generation.status == Generation.Status.DONE  # finished with what it had
    assert Item.objects.get(pk=item.pk).status == Item.Status.DECIDED
    settings.GENERATION_LOST_AFTER_S = 0
    assert recovery.generations_sweep(broker_backlog=0).generate == []
    with pytest.raises(ValidationError, match="decided"):
        candidate_retry(candidate_id=waiting.pk)


def test_an_item_still_open_to_a_reviewer_goes_on_generating(
    queue: Any, user: Any, logged_in: Client
) -> None:
    """A skip hands the item back to the queue (to others at once, to the skipper after
    everything else), and a first decision on an item that asks for two reviewers leaves it
    to the second: its candidates keep coming for them. The last decision stops them."""
    queue.reviewers_per_item = 2
    queue.save()
    item = ItemFactory(queue=queue, status=Item.Status.GENERATING)
    generation = GenerationFactory(item=item, n_candidates=2, status=Generation.Status.RUNNING)
    done = CandidateFactory(generation=generation, position=0)
    coming = CandidateFactory(generation=generation, position=1, status=Candidate.Status.PENDING)
    logged_in.post(f"/items/{item.pk}/skip/")
    assert Candidate.objects.get(pk=coming.pk).status == Candidate.Status.PENDING
    decision_record(item_id=item.pk, reviewer=user, verdict="chosen", candidate_id=done.pk)
    assert Candidate.objects.get(pk=coming.pk).status == Candidate.Status.PENDING

    second = UserFactory()
    queue.members.add(second)
    decision_record(item_id=item.pk, reviewer=second, verdict="none_acceptable")
    coming.refresh_from_db()
    assert (coming.status, coming.error) == (Candidate.Status.FAILED, STOPPED_BY_DECISION)


def _locked_tables(queries: CaptureQueriesContext) -> list[str]:
    """The tables rows were locked in by SELECT … FOR UPDATE, in the order they were: those
    it names ("of"), else every table it reads (PostgreSQL locks the rows of each join)."""
    tables = []
    for query in queries.captured_queries:
        lock = re.search(r" FOR (?:NO KEY )?UPDATE(?: OF (?P<of>.+))?$", query["sql"])
        if lock is not None:
            named = lock["of"] or query["sql"][: lock.start()]
            tables += re.findall(r'"(\w+)"' if lock["of"] else r'(?:FROM|JOIN) "(\w+)"', named)
    return tables


@pytest.mark.postgresql  # SQLite locks no rows
def test_deciding_and_undoing_lock_the_item_first_and_not_its_queue(
    item_with_candidates: Any, user: Any
) -> None:
    item, candidates = item_with_candidates
    with CaptureQueriesContext(connection) as deciding:
        decision = decision_record(
            item_id=item.pk, reviewer=user, verdict="chosen", candidate_id=candidates[0].pk
        )
    with CaptureQueriesContext(connection) as undoing:
        decision_undo(decision_id=decision.pk, reviewer=user)

    assert _locked_tables(deciding) == ["queues_item"]
    assert _locked_tables(undoing)[:2] == ["queues_item", "review_decision"]
    assert "queues_queue" not in _locked_tables(undoing)
