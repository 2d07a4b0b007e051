"""What the gateway served, as a queue's members see it: the dashboard's figures and the log."""

from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from icrlhf.gateway import pace
from icrlhf.gateway.models import Call
from icrlhf.insights.selectors import queue_dashboard
from tests.factories import QueueFactory, UserFactory
from tests.gateway.test_call_log_dead_letters import answered, set_aside
from tests.support.caches import cache_in_redis

pytestmark = pytest.mark.django_db


def served(queue: Any, **fields: Any) -> Call:
    values: dict[str, Any] = {
        "source": "model",
        "memory": "used",
        "request_text": "Where is my card?",
        "answer_text": "It ships in 3 days.",
        "total_ms": 1000,
        "retrieval_ms": 10,
        "upstream_ms": 980,
        **fields,
    }
    return Call.objects.create(queue=queue, **values)


def test_the_dashboard_counts_calls_memory_and_latency(queue: Any) -> None:
    for latency in range(100, 2100, 100):  # 100 … 2000 ms, and 5, 900 ms below: 22 answered
        served(queue, total_ms=latency)
    served(queue, source="memory", total_ms=5)
    served(queue, memory="empty", total_ms=900)
    served(queue, memory="unavailable", status_code=502, total_ms=30)
    served(queue, created_at=timezone.now() - timedelta(days=40))  # outside the 30 days
    served(QueueFactory())  # another queue's

    serving = queue_dashboard(queue=queue).serving
    totals = serving.totals
    assert (totals.calls, totals.memory_used, totals.from_memory, totals.failed) == (23, 21, 1, 1)
    assert totals.latency_p95_ms == 1900
    assert serving.by_day[-1].calls == 23 and serving.by_day[0].calls == 0


def test_the_log_shows_where_a_calls_time_went(queue: Any, logged_in: Client) -> None:
    served(
        queue,
        upstream_ms=980,
        model_prompt_ms=600,
        model_generation_ms=300,
        cached_prompt_tokens=12,
        asks=2,
    )
    served(queue, request_text="A streamed call", upstream_ms=500)  # no model times reported
    page = logged_in.get(f"/q/{queue.slug}/calls/").content.decode()
    assert "waited 80 · read 600 · wrote 300 ms" in page
    assert "asked 2 times" in page and "12 cached" in page
    assert page.count("waited ") == 1


def test_the_log_says_the_models_pace_now_and_what_is_refused(
    queue: Any, logged_in: Client
) -> None:
    page = logged_in.get(f"/q/{queue.slug}/calls/").content.decode()
    assert "Too few of this queue's calls in the last minute" in page
    pace._read.clear()  # the page read it within the second
    for _ in range(3):
        served(
            queue,
            upstream_ms=12_000,
            model_prompt_ms=1_000,
            model_generation_ms=10_000,
            prompt_tokens=500,
            completion_tokens=100,
        )
    page = logged_in.get(f"/q/{queue.slug}/calls/").content.decode()
    assert "from this queue's 3 calls of the last minute:" in page
    assert "waits 1.0 s for a free slot" in page
    assert "read at 500 tokens a second and its answer written at 10.0" in page
    assert "refused at once (503" in page
    pace._read.clear()
    for _ in range(4):
        served(queue, status_code=504, upstream_ms=None)
    page = logged_in.get(f"/q/{queue.slug}/calls/").content.decode()
    assert "(4 lost to the deadline): most were lost, so calls are refused at once" in page


def test_the_log_lists_the_queues_calls_escaped(queue: Any, logged_in: Client) -> None:
    served(queue, answer_text="<script>alert(1)</script>", source="memory")
    served(QueueFactory(), request_text="Another queue's secret")
    page = logged_in.get(f"/q/{queue.slug}/calls/").content.decode()
    assert "Where is my card?" in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<script>alert(1)" not in page
    assert "Another queue's secret" not in page
    assert 'class="badge memory">memory' in page


@pytest.mark.parametrize("role", ["reviewer", "curator"])
def test_reviewers_and_curators_see_the_log_and_no_one_else(queue: Any, role: str) -> None:
    """The log holds what end users wrote: a viewer of the queue, or anyone of another
    queue (whatever their role there), does not see it."""
    served(queue)
    member = Client()
    member.force_login(UserFactory())
    queue.members.add(member.session["_auth_user_id"], through_defaults={"role": role})
    assert "Where is my card?" in member.get(f"/q/{queue.slug}/calls/").content.decode()

    viewer = Client()
    viewer.force_login(UserFactory())
    queue.members.add(viewer.session["_auth_user_id"], through_defaults={"role": "viewer"})
    assert viewer.get(f"/q/{queue.slug}/calls/").status_code == 403
    assert "Gateway calls" not in viewer.get(f"/q/{queue.slug}/").content.decode()

    outsider = Client()
    outsider.force_login(UserFactory())
    QueueFactory().members.add(outsider.session["_auth_user_id"], through_defaults={"role": role})
    assert outsider.get(f"/q/{queue.slug}/calls/").status_code == 404
    assert outsider.get(f"/q/{queue.slug}/dashboard/").status_code == 404
    assert Client().get(f"/q/{queue.slug}/calls/").status_code == 302


def test_the_log_pages_fifty_at_a_time(queue: Any, logged_in: Client) -> None:
    for n in range(51):
        served(queue, request_text=f"request {n:02d}")
    first = logged_in.get(f"/q/{queue.slug}/calls/").content.decode()
    assert "request 50" in first and "request 00" not in first and "Older →" in first
    second = logged_in.get(f"/q/{queue.slug}/calls/?page=2").content.decode()
    assert "request 00" in second


def test_what_end_users_wrote_leaves_the_log_after_the_retention_period(
    queue: Any, logged_in: Client, settings: Any
) -> None:
    """CALL_RETENTION_DAYS: older calls lose request, context and answer; their figures
    stay for the dashboard. 0 keeps everything."""
    from icrlhf.gateway import retention

    settings.CALL_RETENTION_DAYS = 30
    now = timezone.now()
    old = served(
        queue,
        created_at=now - timedelta(days=31),
        request_text="My IBAN is DE89 3704 0044 0532 0130 00",
        context=[{"role": "system", "content": "Customer: Jane Doe"}],
        total_ms=700,
    )
    recent = served(queue, created_at=now - timedelta(days=29))
    assert retention.calls_purge(now=now) == 1
    old.refresh_from_db()
    recent.refresh_from_db()
    assert (old.request_text, old.context, old.answer_text) == ("", [], "")
    assert old.total_ms == 700 and old.source == "model"  # the figures stay
    assert recent.request_text == "Where is my card?"
    assert retention.calls_purge(now=now) == 0  # nothing left to purge
    page = logged_in.get(f"/q/{queue.slug}/calls/").content.decode()
    assert "DE89" not in page and "removed after the retention period" in page

    settings.CALL_RETENTION_DAYS = 0
    assert retention.calls_purge(now=now + timedelta(days=400)) == 0


def test_the_upstreams_own_words_in_the_log_are_for_admins(queue: Any, logged_in: Client) -> None:
    served(queue, status_code=400, error="The model rejected the request: mail evil.example")
    page = logged_in.get(f"/q/{queue.slug}/calls/").content.decode()
    assert "The model rejected the request" in page and "evil.example" not in page
    admin = Client()
    admin.force_login(UserFactory(is_superuser=True))
    assert "evil.example" in admin.get(f"/q/{queue.slug}/calls/").content.decode()


@pytest.mark.django_db(transaction=True)  # the writer closes its connection, as in its thread
@pytest.mark.usefixtures("redis_cache")
def test_admins_see_the_call_logs_dead_letters_and_what_to_do_and_no_one_else(
    queue: Any, logged_in: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    answered(queue, refused=True)
    set_aside(monkeypatch)
    answered(queue)  # no writer since: waiting
    admin = Client()
    admin.force_login(UserFactory(groups=["admin"]))

    page = admin.get(f"/q/{queue.slug}/calls/").content.decode()

    assert "<strong>1</strong><span>calls answered, waiting to be logged</span>" in page
    assert "<strong>1</strong><span>dead letter</span>" in page
    assert 'class="warning" role="status">A dead letter is a call' in page
    assert "<code>python manage.py call_log_dead_letters</code>" in page
    assert "<code>--retry</code>" in page and "<code>--discard</code>" in page
    # Install-wide figures about the gateway, for admins: not for the queue's own members.
    assert "dead letter" not in logged_in.get(f"/q/{queue.slug}/calls/").content.decode()


def test_admins_are_told_when_there_is_no_journal_or_it_is_out_of_reach(
    queue: Any, settings: Any
) -> None:
    admin = Client()
    admin.force_login(UserFactory(is_superuser=True))

    assert (
        "No journal: the cache is not Redis"
        in admin.get(f"/q/{queue.slug}/calls/").content.decode()
    )

    cache_in_redis(settings)
    settings.CACHES["default"]["LOCATION"] = "redis://127.0.0.1:9/0"  # nothing listens there
    page = admin.get(f"/q/{queue.slug}/calls/").content.decode()
    assert "The journal (Redis) cannot be reached" in page
