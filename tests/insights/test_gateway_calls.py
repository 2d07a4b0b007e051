"""What the gateway served, as a queue's members see it: the dashboard's figures and the log."""

from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from icrlhf.gateway.models import Call
from icrlhf.insights.selectors import queue_dashboard
from tests.factories import QueueFactory, UserFactory

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


def test_the_log_lists_the_queues_calls_escaped(queue: Any, logged_in: Client) -> None:
    served(queue, answer_text="<script>alert(1)</script>", source="memory")
    served(QueueFactory(), request_text="Another queue's secret")
    page = logged_in.get(f"/q/{queue.slug}/calls/").content.decode()
    assert "Where is my card?" in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<script>alert(1)" not in page
    assert "Another queue's secret" not in page
    assert 'class="badge memory">memory' in page


@pytest.mark.parametrize("roles", [["reviewer"], ["curator"]])
def test_every_member_sees_the_log_and_no_one_else(queue: Any, roles: list[str]) -> None:
    served(queue)
    member = Client()
    member.force_login(UserFactory(roles=roles))
    queue.members.add(member.session["_auth_user_id"])
    assert "Where is my card?" in member.get(f"/q/{queue.slug}/calls/").content.decode()

    outsider = Client()
    outsider.force_login(UserFactory(roles=roles))
    QueueFactory(members=[outsider.session["_auth_user_id"]])
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
