"""Review generation's share of an endpoint (issue 46): a flood of review work never takes
more than REVIEW_GENERATION_MAX_CONCURRENT of an endpoint's calls at once; what waits is not
a failure, waits in line in fair order until a slot is given back (issue 59: it does not ask
again meanwhile), and is not mistaken for lost by the sweeper."""

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from icrlhf.generation import endpoint_share, pipeline, recovery, tasks
from icrlhf.generation.models import Candidate, Generation
from icrlhf.generation.services import item_create
from icrlhf.integrations import llm
from tests.factories import QueueFactory
from tests.support.llm_answer import LLMAnswer

pytestmark = pytest.mark.django_db


@pytest.fixture
def one_at_a_time(settings: Any) -> None:
    settings.REVIEW_GENERATION_MAX_CONCURRENT = 1


@pytest.fixture
def model_calls(llm_answer: LLMAnswer, monkeypatch: pytest.MonkeyPatch) -> list[llm.Call]:
    """The model calls review makes, each answered through litellm's offline switch."""
    made: list[llm.Call] = []
    real = llm.complete_n
    llm_answer("It ships tomorrow.")

    def complete_n(call: llm.Call, n: int) -> Any:
        made.append(call)
        return real(call, n)

    monkeypatch.setattr(pipeline.llm, "complete_n", complete_n)
    return made


@pytest.fixture
def sent_again(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []
    monkeypatch.setattr(
        tasks.candidates_generate,
        "apply_async",
        lambda args, kwargs=None, **options: sent.append(
            {"args": args, "kwargs": kwargs or {}, **options}
        ),
    )
    return sent


def _prepared(queue: Any, user: Any, *, inline: bool = False) -> Generation:
    item = item_create(queue=queue, input_text="Where is my card?", created_by=user)
    pipeline.generation_prepare(generation_id=item.generations.get().pk, inline=inline)
    return Generation.objects.get(item=item)


@pytest.mark.usefixtures("vector_store", "one_at_a_time")
def test_a_generation_waits_in_line_for_its_share_and_is_woken_when_a_slot_comes_back(
    queue: Any,
    user: Any,
    model_calls: list[llm.Call],
    sent_again: list[dict[str, Any]],
    django_capture_on_commit_callbacks: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(endpoint_share, "clock", lambda: 1234.5)  # when the second joins
    first, second = _prepared(queue, user), _prepared(queue, user)
    first_ids = list(first.candidates.order_by("pk").values_list("pk", flat=True))
    second_ids = list(second.candidates.order_by("pk").values_list("pk", flat=True))

    def while_the_first_runs(claimed: list[Candidate]) -> None:
        """The second asks while the first holds review's one slot of the endpoint."""
        with django_capture_on_commit_callbacks(execute=True):
            tasks.candidates_generate.apply(args=[second_ids])
        waiting = list(second.candidates.all())
        assert {(c.status, c.attempts) for c in waiting} == {(Candidate.Status.PENDING, 0)}
        assert all(c.retry_at is not None for c in waiting)
        assert sent_again == []  # in line: nothing asks again meanwhile
        # Another endpoint's share is its own.
        elsewhere = _prepared(QueueFactory(api_base="http://127.0.0.1:9/other/v1"), user)
        pipeline.candidates_generate(candidate_ids=[c.pk for c in elsewhere.candidates.all()])
        pipeline._candidates_run(claimed)

    pipeline._candidates_run_in_share(
        pipeline._candidates_claim(first_ids), run=while_the_first_runs
    )
    assert len(model_calls) == 2  # the first's and the other endpoint's
    # Its slot given back, the first woke the second, at once.
    [woken] = sent_again
    assert woken["args"] == (second_ids,) and woken["priority"] == 0
    assert woken["kwargs"]["woken"] is True
    # Its place in line goes with it (its fair priority, then the time it joined).
    assert woken["kwargs"]["place"] % endpoint_share._PRIORITY_WEIGHT == 1234.5
    pipeline.candidates_generate(candidate_ids=second_ids, woken=True)
    assert len(model_calls) == 3
    done = list(second.candidates.all())
    assert {(c.status, c.attempts) for c in done} == {(Candidate.Status.DONE, 1)}
    assert endpoint_share.slot_take(api_base="") is not None  # given back after the call
    assert endpoint_share.next_in_line(api_base="") is None


@pytest.mark.usefixtures("vector_store", "one_at_a_time")
def test_the_line_is_in_fair_order_and_a_woken_generation_stopped_meanwhile_wakes_the_next(
    queue: Any, user: Any, sent_again: list[dict[str, Any]]
) -> None:
    flood, stopped, next_one = (_prepared(queue, user) for _ in range(3))
    ids = [list(g.candidates.values_list("pk", flat=True)) for g in (flood, stopped, next_one)]
    endpoint_share.wait_in_line(api_base="", candidate_ids=ids[0], priority=3)
    endpoint_share.wait_in_line(api_base="", candidate_ids=ids[1], priority=0)
    endpoint_share.wait_in_line(api_base="", candidate_ids=ids[2], priority=0)
    endpoint_share.wait_in_line(api_base="", candidate_ids=ids[1], priority=0)  # keeps its place
    assert first_in_line() == ids[1]
    Candidate.objects.filter(pk__in=ids[1]).update(status=Candidate.Status.FAILED)
    pipeline.candidates_generate(candidate_ids=ids[1], woken=True)  # nothing to claim
    assert [sent["args"] for sent in sent_again] == [(ids[2],)]
    assert first_in_line() == ids[0]  # the flood's comes last


def first_in_line() -> list[int] | None:
    """The candidates first in the install's endpoint's line, taken out of it."""
    woken = endpoint_share.next_in_line(api_base="")
    return None if woken is None else woken.candidate_ids


@pytest.mark.usefixtures("vector_store", "one_at_a_time")
def test_a_woken_generation_a_newcomer_took_the_slot_from_keeps_its_place_in_line(
    queue: Any, user: Any, sent_again: list[dict[str, Any]], django_capture_on_commit_callbacks: Any
) -> None:
    """Woken for a slot given back, a generation may find it taken by one that just arrived;
    it joins the line again where it was, ahead of all who joined after it."""
    woken_one, later = (_prepared(queue, user) for _ in range(2))
    ids = [
        list(g.candidates.order_by("pk").values_list("pk", flat=True)) for g in (woken_one, later)
    ]
    endpoint_share.wait_in_line(api_base="", candidate_ids=ids[0], priority=0)
    endpoint_share.wait_in_line(api_base="", candidate_ids=ids[1], priority=0)
    woken = endpoint_share.next_in_line(api_base="")
    assert woken is not None and woken.candidate_ids == ids[0]
    newcomer = endpoint_share.slot_take(api_base="")  # before the woken one could take it
    assert newcomer is not None
    with django_capture_on_commit_callbacks(execute=True):
        tasks.candidates_generate.apply(args=[ids[0]], kwargs={"woken": True, "place": woken.place})
    assert set(woken_one.candidates.values_list("status", "attempts")) == {("pending", 0)}
    assert first_in_line() == ids[0]
    assert first_in_line() == ids[1]


@pytest.mark.usefixtures("vector_store", "one_at_a_time")
def test_a_prepare_task_that_generates_inline_waits_for_the_share_too(
    queue: Any,
    user: Any,
    model_calls: list[llm.Call],
    sent_again: list[dict[str, Any]],
    django_capture_on_commit_callbacks: Any,
) -> None:
    held = endpoint_share.slot_take(api_base="")
    assert held is not None
    with django_capture_on_commit_callbacks(execute=True):
        generation = _prepared(queue, user, inline=True)
    assert model_calls == []
    assert set(generation.candidates.values_list("status", "attempts")) == {("pending", 0)}
    assert sent_again == []
    ids = sorted(generation.candidates.values_list("pk", flat=True))
    assert sorted(first_in_line() or []) == ids
    assert generation.status == Generation.Status.RUNNING


def test_a_slot_never_given_back_stops_counting_once_no_call_could_still_run(
    one_at_a_time: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker killed mid-call never gives its slot back: review's share of the endpoint is
    not shrunk for good."""
    now = [1_000_000.0]
    monkeypatch.setattr(endpoint_share, "clock", lambda: now[0])
    assert endpoint_share.slot_take(api_base="") is not None  # its worker is killed
    assert endpoint_share.slot_take(api_base="") is None
    now[0] += endpoint_share._longest_call_s()
    assert endpoint_share.slot_take(api_base="") is None  # the call could still be running
    now[0] += 2 * endpoint_share.BUCKET_S
    assert endpoint_share.slot_take(api_base="") is not None


def test_a_candidate_waiting_for_the_share_is_not_swept_until_its_ask_is_overdue(
    queue: Any, user: Any, settings: Any
) -> None:
    """Waiting for a share can outlast GENERATION_LOST_AFTER_S in a flood; the candidate's
    ask is due by its `retry_at` (it is woken sooner when a slot comes back), and a sweep
    enqueuing it again before then would only send it back to its place in line. Only an
    ask overdue by GENERATION_LOST_AFTER_S was lost (its wake, or its worker)."""
    item = item_create(queue=queue, input_text="Where is my card?", created_by=user)
    generation = item.generations.get()
    long_ago = timezone.now() - timedelta(hours=1)
    Generation.objects.filter(pk=generation.pk).update(
        status=Generation.Status.RUNNING, prepared_at=long_ago
    )
    waiting = generation.candidates.first()
    assert waiting is not None
    soon = timezone.now() + timedelta(seconds=5)
    Candidate.objects.filter(pk=waiting.pk).update(retry_at=soon, started_at=long_ago)
    settings.GENERATION_LOST_AFTER_S = 120
    swept = recovery.generations_sweep(broker_backlog=0).generate
    assert waiting.pk not in swept and len(swept) == 2  # its siblings never asked
    Candidate.objects.filter(pk=waiting.pk).update(retry_at=long_ago)
    assert waiting.pk in recovery.generations_sweep(broker_backlog=0).generate
