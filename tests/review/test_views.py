"""The item page says what is happening and refuses what it cannot stand behind: waiting and
failing in words, a stale page's decision, a skipped item coming back, the ranking's note."""

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from icrlhf.gateway.models import Call
from icrlhf.generation.models import Candidate, Generation
from icrlhf.review import selectors
from icrlhf.review.models import Claim, Decision
from icrlhf.review.templatetags.markup import word_diff
from tests.factories import (
    CandidateFactory,
    DecisionFactory,
    GenerationFactory,
    ItemFactory,
    UserFactory,
    agent_step,
    ready_generation,
)

pytestmark = pytest.mark.django_db

TIMEOUT_ERROR = (
    "The model did not answer in time: APITimeoutError - Request timed out. "
    "Error_str: Request timed out."
)


def running_generation(queue: Any, **candidate: Any) -> tuple[Any, Candidate]:
    item = ItemFactory(queue=queue, status="generating")
    generation = GenerationFactory(item=item, n_candidates=2, status=Generation.Status.RUNNING)
    CandidateFactory(generation=generation, position=0, text="Ready one.")
    waiting = CandidateFactory(generation=generation, position=1, **candidate)
    return item, waiting


def test_a_timeout_reads_as_a_sentence_and_its_raw_text_is_for_admins(
    queue: Any, logged_in: Client, user: User
) -> None:
    item, _ = running_generation(
        queue, status=Candidate.Status.FAILED, error=f"Gave up after 4 attempts. {TIMEOUT_ERROR}"
    )
    page = logged_in.get(f"/items/{item.pk}/").content.decode()
    assert "The model did not answer within 60 s; gave up after 4 attempts" in page
    assert "APITimeoutError" not in page

    user.is_staff = True
    user.save()
    assert "APITimeoutError" in logged_in.get(f"/items/{item.pk}/").content.decode()


def test_a_retrying_candidate_says_which_retry_and_when(
    queue: Any, logged_in: Client, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.LLM_MAX_RETRIES = 3
    # The clock stands still while the page renders: a loaded machine must not turn 8 s into 7.
    frozen = timezone.now()
    item, _ = running_generation(
        queue,
        status=Candidate.Status.PENDING,
        attempts=2,
        error=f"Retrying: {TIMEOUT_ERROR}",
        retry_at=frozen + timedelta(seconds=7.5),
    )
    monkeypatch.setattr(timezone, "now", lambda: frozen)
    page = logged_in.get(f"/items/{item.pk}/").content.decode()
    assert "The model did not answer within 60 s; retrying (2 of 3) in 8 s." in page
    assert "retrying, " in page  # the generation's state
    assert "Error_str" not in page


def test_a_queued_generation_says_how_many_are_ahead_and_how_long_it_has_waited(
    queue: Any, logged_in: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    earlier = GenerationFactory(item=ItemFactory(queue=queue), status=Generation.Status.RUNNING)
    Generation.objects.filter(pk=earlier.pk).update(
        created_at=timezone.now() - timedelta(minutes=1)
    )
    item = ItemFactory(queue=queue, status="generating")
    generation = GenerationFactory(item=item, n_candidates=1, status=Generation.Status.PENDING)
    CandidateFactory(generation=generation, status=Candidate.Status.PENDING, text="")
    frozen = timezone.now()  # the clock stands still while the page renders
    Generation.objects.filter(pk=generation.pk).update(created_at=frozen - timedelta(seconds=12))
    monkeypatch.setattr(timezone, "now", lambda: frozen)
    page = logged_in.get(f"/items/{item.pk}/").content.decode()
    assert "queued, 1 ahead, 12 s so far" in page
    assert "Queued for the model." in page


def test_polling_goes_on_until_the_ranking_has_renumbered_the_candidates(
    queue: Any, logged_in: Client
) -> None:
    item = ItemFactory(queue=queue)
    generation = ready_generation(item, ["one", "two"])
    Generation.objects.filter(pk=generation.pk).update(finished_at=timezone.now())
    htmx = {"HTTP_HX_REQUEST": "true"}
    assert logged_in.get(f"/items/{item.pk}/", **htmx).status_code == 200  # keeps polling

    Generation.objects.filter(pk=generation.pk).update(ranked_at=timezone.now())
    assert logged_in.get(f"/items/{item.pk}/", **htmx).status_code == 286  # stops


def test_the_ranking_note_is_shown_only_when_history_ranked_the_candidates(
    queue: Any, logged_in: Client
) -> None:
    note = "best first, by what this queue's reviewers accepted before"
    item = ItemFactory(queue=queue)
    generation = ready_generation(item, ["one", "two"])
    Generation.objects.filter(pk=generation.pk).update(ranked_at=timezone.now())
    assert note not in logged_in.get(f"/items/{item.pk}/").content.decode()

    Generation.objects.filter(pk=generation.pk).update(stored_examples=12)
    assert note in logged_in.get(f"/items/{item.pk}/").content.decode()


def test_a_decision_from_a_page_that_showed_other_candidates_is_refused(
    queue: Any, logged_in: Client
) -> None:
    item = ItemFactory(queue=queue)
    generation = ready_generation(item, ["one", "two", "three"])
    first, second, third = generation.candidates.order_by("position")
    logged_in.get(f"/items/{item.pk}/")  # claims it
    duplicated = f"{second.pk},{second.pk},{first.pk}"  # one shown twice, one hidden

    response = logged_in.post(
        f"/items/{item.pk}/decide/",
        {"choice": f"c{second.pk}", "shown_candidates": duplicated},
        follow=True,
    )
    assert "did not show this item&#x27;s candidates as they are stored" in (
        response.content.decode()
    )
    assert not Decision.objects.exists()

    shown = f"{third.pk},{first.pk},{second.pk}"  # the same ones, in another order: fine
    logged_in.post(
        f"/items/{item.pk}/decide/", {"choice": f"c{second.pk}", "shown_candidates": shown}
    )
    assert Decision.objects.get().chosen_candidate == second


def test_the_page_sends_the_candidates_it_shows(queue: Any, logged_in: Client) -> None:
    item = ItemFactory(queue=queue)
    generation = ready_generation(item, ["one", "two"])
    ids = ",".join(
        str(pk) for pk in generation.candidates.order_by("position").values_list("pk", flat=True)
    )
    page = logged_in.get(f"/items/{item.pk}/").content.decode()
    assert f'data-candidate-ids="{ids}"' in page
    assert f'name="shown_candidates" value="{ids}"' in page


def test_a_skipped_item_that_comes_back_says_so(queue: Any, logged_in: Client, user: User) -> None:
    item = ItemFactory(queue=queue)
    ready_generation(item, ["one"])
    logged_in.get(f"/items/{item.pk}/")
    logged_in.post(f"/items/{item.pk}/skip/")
    assert Claim.objects.get(item=item).skipped

    response = logged_in.post(f"/q/{queue.slug}/review/next/", follow=True)  # only it is left
    assert "You skipped this item earlier" in response.content.decode()
    colleague = UserFactory()
    queue.members.add(colleague)
    other = Client()
    other.force_login(colleague)
    assert "You skipped" not in other.get(f"/items/{item.pk}/").content.decode()


def test_the_end_of_the_queue_sums_up_the_day_and_leads_on(queue: Any, logged_in: Client) -> None:
    item = ItemFactory(queue=queue)
    generation = ready_generation(item, ["one", "two"])
    logged_in.get(f"/items/{item.pk}/")
    logged_in.post(f"/items/{item.pk}/decide/", {"choice": f"c{generation.candidates.first().pk}"})
    page = logged_in.get(f"/q/{queue.slug}/review/").content.decode()
    assert "Nothing left to review" in page
    assert "Today you decided <strong>1</strong> item in this queue: 1 chosen." in page
    assert f'href="/q/{queue.slug}/dashboard/"' in page
    assert f'href="/q/{queue.slug}/#new-item"' in page


def test_the_word_diff_groups_a_rewrite_into_one_change() -> None:
    assert str(word_diff("the cat sat here", "a dog ran here")) == (
        "<del>the cat sat</del><ins>a dog ran</ins> here"
    )
    # Changes far apart stay apart; what is between them stays unmarked.
    assert str(word_diff("one two three four five", "uno two three four cinco")) == (
        "<del>one</del><ins>uno</ins> two three four <del>five</del><ins>cinco</ins>"
    )
    assert str(word_diff("<b>x</b>", "<i>x</i>")) == (
        "<del>&lt;b&gt;x&lt;/b&gt;</del><ins>&lt;i&gt;x&lt;/i&gt;</ins>"
    )


def test_a_very_long_edit_is_not_compared_word_by_word_on_every_view() -> None:
    """A 20,000-character edit: the comparison would cost seconds on each view of the page;
    the page says it is too long instead. Below the cap a pair is compared once."""
    long_original = " ".join(f"word{n}" for n in range(2_000))
    long_final = long_original.replace("word1 ", "changed ") + " <script>"
    shown = str(word_diff(long_original, long_final))
    assert "Too long to compare word by word" in shown and "<del>" not in shown
    assert "script" not in shown
    from icrlhf.review.templatetags import markup

    markup._word_diff.cache_clear()
    word_diff("a b", "a c")
    word_diff("a b", "a c")
    assert markup._word_diff.cache_info().hits == 1


def test_a_captured_step_of_an_agent_run_links_to_the_runs_timeline(
    queue: Any, logged_in: Client
) -> None:
    goal = [{"role": "user", "content": "Where is order 4821?"}]
    later = [*goal, {"role": "assistant", "content": "Which address?"}]
    later.append({"role": "user", "content": "Berlin."})
    agent_step(queue, goal, key="run-1", text="Which address?")
    item = ItemFactory(queue=queue, source="gateway", status="ready")
    ready_generation(item, ["It ships Monday.", "It is in Berlin."])
    call = Call.objects.create(
        queue=queue, source="model", memory="empty", request_text="Berlin.", item=item
    )
    recorded = agent_step(queue, later, key="run-1", text="It ships Monday.", call_id=call.pk)
    page = logged_in.get(f"/items/{item.pk}/").content.decode()
    assert "Step 2 of 2 in an agent run" in page
    assert f"/q/{queue.slug}/trajectories/{recorded.trajectory.pk}/" in page


def test_a_captured_steps_state_is_its_goal_its_latest_observation_and_earlier_turns() -> None:
    goal = {"role": "user", "content": "Refund order 4821."}
    call = {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
    looked = {"role": "tool", "tool_call_id": "c1", "content": '{"status": "lost"}'}
    conversation = [
        {"role": "system", "content": "You are the desk."},
        goal,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        looked,
    ]
    tools = [{"type": "function", "function": {"name": "lookup"}}]
    item = ItemFactory(source="gateway", conversation=conversation, call_options={"tools": tools})
    state = selectors.step_state(item=item)
    assert state == selectors.StepState(
        goal="Refund order 4821.",
        latest=[looked],
        earlier=[conversation[2]],
        tool_names=["lookup"],
    )
    # A ticket, or a one-turn call without tools, is shown as it is.
    assert selectors.step_state(item=ItemFactory()) is None
    one_turn = ItemFactory(source="gateway", conversation=[goal])
    assert selectors.step_state(item=one_turn) is None


def test_a_captured_calls_timings_are_hidden_until_it_is_decided(
    queue: Any, logged_in: Client, user: User
) -> None:
    item = ItemFactory(queue=queue, source="gateway", status="ready")
    generation = ready_generation(item, ["Served answer.", "New answer."])
    Candidate.objects.filter(generation=generation).update(latency_ms=812)
    assert " ms" not in logged_in.get(f"/items/{item.pk}/").content.decode().split("Candidates")[1]
    DecisionFactory(generation=generation, reviewer=user)
    assert "812 ms" in logged_in.get(f"/items/{item.pk}/").content.decode()


@pytest.mark.parametrize(("attempts", "said"), [(2, "retrying (2 of 3)"), (5, "retrying (3 of 3)")])
def test_a_retry_count_never_passes_the_limit(
    queue: Any, logged_in: Client, settings: Any, attempts: int, said: str
) -> None:
    settings.LLM_MAX_RETRIES = 3
    item, _ = running_generation(
        queue,
        status=Candidate.Status.PENDING,
        attempts=attempts,
        error=f"Retrying: {TIMEOUT_ERROR}",
    )
    assert said in logged_in.get(f"/items/{item.pk}/").content.decode()


def test_when_only_the_served_answer_is_left_the_page_says_so(
    queue: Any, logged_in: Client
) -> None:
    item = ItemFactory(queue=queue, source="gateway", status="ready")
    generation = ready_generation(item, ["Served answer.", "", ""])
    Candidate.objects.filter(generation=generation, position=0).update(served=True)
    Candidate.objects.filter(generation=generation, position__gt=0).update(
        status=Candidate.Status.FAILED, error="The model is rate-limited"
    )
    page = logged_in.get(f"/items/{item.pk}/").content.decode()
    assert "1 of 3 ready, 2 failed" in page
    assert "The other candidates failed: only one answer is left to judge." in page
    # Decided on it alone: recorded as a choice among one, and said so.
    served = Candidate.objects.get(generation=generation, served=True)
    logged_in.post(f"/items/{item.pk}/decide/", {"choice": f"c{served.pk}"})
    assert Decision.objects.get(item=item).candidates_done == 1
    assert "on the one answer left" in logged_in.get(f"/items/{item.pk}/").content.decode()


def test_the_page_object_says_each_candidates_state_beside_its_row(queue: Any, user: User) -> None:
    item, failed = running_generation(queue, status=Candidate.Status.FAILED, error=TIMEOUT_ERROR)
    page = selectors.item_page(item=item, user=user, poll=False)

    card = next(card for card in page.cards if card.candidate == failed)
    assert card.problem.summary == "The model did not answer within 60 s"
    assert not hasattr(card.candidate, "problem")  # nothing written on the row
    # Open, unclaimed, a finished candidate to pick: the page takes it as it loads.
    assert (page.claim_on_load, page.can_decide, page.can_regenerate) == (True, True, False)
    assert page.review_progress is not None
    assert selectors.item_page(item=item, user=user, poll=True).review_progress is None
