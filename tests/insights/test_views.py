"""The per-queue dashboard: figures from real decisions, charts as inline SVG, members only."""

import html
import re
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from icrlhf.gateway.models import Call
from icrlhf.gateway.services import held_out
from icrlhf.generation.models import Candidate
from icrlhf.insights.charts import Series, line_chart, nice_ceiling
from icrlhf.insights.selectors import DECISIONS_PER_POINT, queue_dashboard
from icrlhf.memory.models import Example, Retrieval
from icrlhf.review.decisions import decision_record
from icrlhf.review.models import Decision
from icrlhf.trajectories.feedback import feedback_record
from tests.factories import ItemFactory, QueueFactory, UserFactory, agent_step, ready_generation

pytestmark = pytest.mark.django_db


def decide(
    queue: Any, user: Any, verdict: str, *, seconds: int = 10, from_memory: bool = False
) -> Decision:
    item = ItemFactory(queue=queue)
    generation = ready_generation(item, ["first answer", "second answer"])
    candidate = generation.candidates.order_by("pk").first()
    assert candidate is not None
    if from_memory:
        Candidate.objects.filter(pk=candidate.pk).update(source=Candidate.Source.MEMORY)
    return decision_record(
        item_id=item.pk,
        reviewer=user,
        verdict=verdict,
        candidate_id=None if verdict == "none_acceptable" else candidate.pk,
        final_text="an edited answer" if verdict == "edited" else "",
        time_to_decide_ms=seconds * 1000,
    )


def test_totals_count_each_verdict_and_the_median_time(queue: Any, user: Any) -> None:
    decide(queue, user, "chosen", seconds=4, from_memory=True)
    decide(queue, user, "chosen", seconds=6)
    decide(queue, user, "edited", seconds=30)
    decide(queue, user, "none_acceptable", seconds=8)
    board = queue_dashboard(queue=queue)
    totals = board.totals
    assert (totals.decisions, totals.chosen, totals.edited, totals.none_acceptable) == (4, 2, 1, 1)
    assert totals.chosen_from_memory == 1
    assert totals.median_seconds == 7.0
    assert board.by_day[-1].decisions == 4  # today is the last day shown
    assert all(day.decisions == 0 for day in board.by_day[:-1])


def test_outcomes_by_decision_count_show_learning_as_a_rising_acceptance(
    queue: Any, user: Any
) -> None:
    for _ in range(DECISIONS_PER_POINT):
        decide(queue, user, "edited")
    for _ in range(DECISIONS_PER_POINT):
        decide(queue, user, "chosen")
    decide(queue, user, "none_acceptable")
    runs = queue_dashboard(queue=queue).by_count
    assert [run.label for run in runs] == ["1–25", "26–50", "51–75"]
    assert [run.rate(run.chosen) for run in runs] == [0.0, 1.0, 0.0]
    assert [run.rate(run.edited) for run in runs] == [1.0, 0.0, 0.0]
    assert runs[2].none_acceptable == 1


def test_an_undone_decision_is_not_counted(queue: Any, user: Any) -> None:
    decision = decide(queue, user, "chosen")
    Decision.objects.filter(pk=decision.pk).update(superseded_at=timezone.now())
    assert queue_dashboard(queue=queue).totals.decisions == 0


def test_memory_counts_live_pinned_retired_and_rejected_examples(queue: Any, user: Any) -> None:
    decide(queue, user, "chosen")  # 1 preferred, 1 rejected
    decide(queue, user, "chosen")
    decide(queue, user, "none_acceptable")  # 2 rejected
    preferred = Example.objects.filter(queue=queue, role="preferred").order_by("created_at")
    Example.objects.filter(pk=preferred[0].pk).update(status=Example.Status.PINNED)
    Example.objects.filter(pk=preferred[1].pk).update(status=Example.Status.RETIRED)
    memory = queue_dashboard(queue=queue).memory
    assert (memory.preferred_live, memory.pinned, memory.retired, memory.rejected) == (1, 1, 1, 4)
    assert memory.preferred_by_day[-1] == 2  # stored, whatever became of them since
    Example.objects.filter(queue=queue).update(created_at=timezone.now() - timedelta(days=3))
    assert queue_dashboard(queue=queue).memory.preferred_by_day[-4:] == [2, 2, 2, 2]


def test_retrieval_is_relevant_when_the_best_example_is_similar_enough(
    queue: Any, user: Any
) -> None:
    decide(queue, user, "chosen")
    example = Example.objects.get(queue=queue, role="preferred")
    for best in (0.9, 0.3):
        generation = ready_generation(ItemFactory(queue=queue), ["answer"])
        Retrieval.objects.create(generation=generation, example=example, score=best, rank=1)
    ready_generation(ItemFactory(queue=queue), ["answer"])  # retrieved nothing
    retrieval = queue_dashboard(queue=queue).retrieval
    assert (retrieval.generations, retrieval.relevant) == (4, 1)  # the decided one had none
    assert retrieval.relevant_by_day[-1] == 0.25
    assert retrieval.relevant_by_day[0] is None  # no generation that day


def test_the_page_shows_figures_and_twelve_charts(queue: Any, user: Any, logged_in: Client) -> None:
    decide(queue, user, "chosen", seconds=5)
    decide(queue, user, "edited", seconds=5)
    page = logged_in.get(f"/q/{queue.slug}/dashboard/").content.decode()
    assert page.count("<svg") == 12
    assert "<polyline" in page  # something was drawn
    assert "50%</strong><span>accepted as is" in page
    assert "5.0 s</strong>" in page
    assert "<script" not in page.split("<main", 1)[1]


def test_an_empty_queue_says_so(queue: Any, logged_in: Client) -> None:
    response = logged_in.get(f"/q/{queue.slug}/dashboard/")
    assert response.status_code == 200
    assert "No decisions yet" in response.content.decode()


def test_the_queue_name_is_escaped(user: Any, logged_in: Client) -> None:
    queue = QueueFactory(name="<img src=x onerror=alert(1)>", members=[user])
    page = logged_in.get(f"/q/{queue.slug}/dashboard/").content.decode()
    assert "<img src=x" not in page
    assert "&lt;img src=x onerror=alert(1)&gt;" in page


def test_only_members_see_a_queue_dashboard(queue: Any) -> None:
    outsider = Client()
    outsider.force_login(UserFactory())
    assert outsider.get(f"/q/{queue.slug}/dashboard/").status_code == 404
    anonymous = Client().get(f"/q/{queue.slug}/dashboard/")
    assert anonymous.status_code == 302
    assert "/accounts/login/" in anonymous["Location"]


@pytest.mark.parametrize(
    ("largest", "top"), [(0, 1.0), (0.7, 1.0), (7.3, 10), (13, 20), (21.5, 25), (163, 200)]
)
def test_axes_end_on_a_round_number_above_the_largest_value(largest: float, top: float) -> None:
    assert nice_ceiling(largest) == top


def test_two_series_at_the_same_value_both_show_and_the_text_is_readable() -> None:
    svg = line_chart(
        title="Acceptance",
        x_labels=["1", "2"],
        series=[
            Series("with memory", "#1f77b4", [0.5, 0.8]),
            Series("without", "#d62728", [0.5, 0.6]),
        ],
    )
    first = re.findall(r'<circle cx="[\d.]+" cy="[\d.]+" r="([\d.]+)"[^>]*stroke="#1f77b4"', svg)
    second = re.findall(r'<circle cx="[\d.]+" cy="[\d.]+" r="([\d.]+)"[^>]*stroke="#d62728"', svg)
    assert len(first) == len(second) == 2
    assert float(first[0]) > float(second[0])  # a ring around the later series' point
    assert 'font-size="15"' in svg


def rewarded_run(queue: Any, key: str, *, holdouts: list[bool], reward: float) -> None:
    """An agent run of one step per call (each held out or not), rewarded by the application."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": f"Goal of {key}"}]
    for number, holdout in enumerate(holdouts):
        call = Call.objects.create(
            queue=queue, source="model", memory="used", request_text="x", holdout=holdout
        )
        agent_step(queue, messages, key=key, text=f"answer {number}", call_id=call.pk)
        messages = [*messages, {"role": "assistant", "content": f"answer {number}"}]
        messages.append({"role": "user", "content": f"next {number}"})
    feedback_record(
        queue=queue, token=None, call_id=None, trajectory_ref=key, reward=reward, success=None
    )


def test_rewards_per_day_compare_runs_with_memory_and_held_out(
    queue: Any, logged_in: Client
) -> None:
    rewarded_run(queue, "a", holdouts=[False, False], reward=1.0)
    rewarded_run(queue, "b", holdouts=[False], reward=0.5)
    rewarded_run(queue, "c", holdouts=[True, True], reward=0.25)
    rewarded_run(queue, "d", holdouts=[True, False], reward=0.0)  # both arms: neither
    rewards = queue_dashboard(queue=queue).rewards
    assert (rewards.with_memory.runs, rewards.with_memory.mean) == (2, 0.75)
    assert (rewards.held_out.runs, rewards.held_out.mean) == (1, 0.25)
    assert rewards.mixed == 1
    today_with, today_held = rewards.by_day[-1]
    assert (today_with.runs, today_held.runs) == (2, 1)
    page = logged_in.get(f"/q/{queue.slug}/dashboard/").content.decode()
    assert "0.75</strong><span>mean reward with memory (2 runs)" in page
    assert "1 more had calls in both arms" in page


def test_a_named_run_is_held_out_as_a_whole_and_about_the_queues_share() -> None:
    queue = QueueFactory(holdout_percent=30)
    draws = [held_out(queue=queue, run_key=f"run-{n}") for n in range(2000)]
    assert all(held_out(queue=queue, run_key=f"run-{n}") == draws[n] for n in range(50))
    assert 0.26 < sum(draws) / len(draws) < 0.34
    assert not any(held_out(queue=QueueFactory(holdout_percent=0), run_key=k) for k in "abc")


def test_the_order_is_measured_against_items_shown_blind(
    queue: Any, user: Any, logged_in: Client
) -> None:
    """The ranking's first candidate kept on 3 of 4 items shown best first and on 1 of 4
    shown blind: the order adds 50 points."""
    from django.utils import timezone as tz

    from icrlhf.generation.models import Generation

    for blind, kept in ((False, 3), (True, 1)):
        for number in range(4):
            item = ItemFactory(queue=queue)
            generation = ready_generation(item, ["ranked first", "ranked second"])
            Generation.objects.filter(pk=generation.pk).update(ranked_at=tz.now(), blind=blind)
            first, second = generation.candidates.order_by("position")
            Candidate.objects.filter(pk=first.pk).update(rank=1)
            Candidate.objects.filter(pk=second.pk).update(rank=2)
            decision_record(
                item_id=item.pk,
                reviewer=user,
                verdict="chosen",
                candidate_id=(first if number < kept else second).pk,
            )
    anchoring = queue_dashboard(queue=queue).anchoring
    assert (anchoring.shown.accepted, anchoring.shown.reviewed) == (3, 4)
    assert (anchoring.blind.accepted, anchoring.blind.reviewed) == (1, 4)
    assert anchoring.difference == pytest.approx(0.5)
    # 50 points on 4 items a side could be chance: said in words, the figure one click away.
    page = html.unescape(logged_in.get(f"/q/{queue.slug}/dashboard/").content.decode())
    assert "How much the order sways reviewers" in page and "+50 pts" not in page
    said = "What the order adds: not enough decided items to tell yet (4 shown first, 4 blind)"
    assert said in page
    assert "A difference of +50 points" in page and "p = 0.486" in page
