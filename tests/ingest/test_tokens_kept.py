"""A process keeps the token rows it authenticated, and reads them again as soon as anything
about them changed: the token (revoked, its scopes, deleted), its queue or any queue. The
stamps live in the machine's real Redis, as installs run them; without Redis nothing is
kept."""

from datetime import datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from icrlhf.ingest import services
from icrlhf.ingest.models import IntegrationToken, Scope
from icrlhf.ingest.services import token_authenticate, token_create
from icrlhf.integrations import counters
from icrlhf.queues.models import Queue
from tests.factories import QueueFactory
from tests.support.caches import cache_in_redis

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def stamps_in_redis(settings: Any) -> None:
    cache_in_redis(settings)


@pytest.fixture
def token() -> tuple[IntegrationToken, str]:
    return token_create(queue=QueueFactory(slug="desk"), name="app")


def test_a_token_authenticated_again_is_answered_without_the_database(
    token: tuple[IntegrationToken, str], django_assert_num_queries: Any
) -> None:
    record, raw = token
    assert token_authenticate(token=raw) == record  # read, and "last used" noted
    with django_assert_num_queries(0):
        again = token_authenticate(token=raw)
    assert again == record and again.queue.slug == "desk"


def test_each_call_gets_instances_of_its_own(token: tuple[IntegrationToken, str]) -> None:
    _, raw = token
    first = token_authenticate(token=raw)
    assert first is not None
    first.queue.slug = "changed-in-memory"
    first.scopes.append("export")
    second = token_authenticate(token=raw)
    assert second is not None
    assert second.queue.slug == "desk" and "export" not in second.scopes


def test_a_token_revoked_by_the_admins_action_is_refused_at_once(
    token: tuple[IntegrationToken, str], admin_client: Client
) -> None:
    record, raw = token
    assert token_authenticate(token=raw) is not None
    admin_client.post(
        reverse("admin:ingest_integrationtoken_changelist"),
        {"action": "revoke", "_selected_action": [record.pk]},
    )
    assert IntegrationToken.objects.get(pk=record.pk).revoked_at is not None
    assert token_authenticate(token=raw) is None


@pytest.mark.parametrize(
    "change",
    [
        lambda record: IntegrationToken.objects.filter(pk=record.pk).update(
            revoked_at=timezone.now()
        ),
        lambda record: record.delete(),
        lambda record: IntegrationToken.objects.filter(pk=record.pk).delete(),
        lambda record: record.queue.delete(),
        lambda record: Queue.objects.filter(pk=record.queue_id).delete(),
    ],
    ids=["revoked", "deleted", "deleted-in-bulk", "queue-deleted", "queue-deleted-in-bulk"],
)
def test_a_token_revoked_or_deleted_with_or_without_its_queue_is_refused(
    token: tuple[IntegrationToken, str], change: Any
) -> None:
    record, raw = token
    assert token_authenticate(token=raw) is not None
    change(record)
    assert token_authenticate(token=raw) is None


def test_a_change_of_scopes_or_of_the_queue_is_read_at_the_next_call(
    token: tuple[IntegrationToken, str],
) -> None:
    record, raw = token
    assert token_authenticate(token=raw) is not None
    record.scopes = [Scope.ITEMS]
    record.save()
    kept = token_authenticate(token=raw)
    assert kept is not None and not kept.allows(Scope.GATEWAY)

    Queue.objects.filter(pk=record.queue_id).update(memory_answer_threshold=0.9)
    kept = token_authenticate(token=raw)
    assert kept is not None and kept.queue.memory_answer_threshold == 0.9

    queue = Queue.objects.get(pk=record.queue_id)
    queue.slug = "renamed"
    queue.save()
    kept = token_authenticate(token=raw)
    assert kept is not None and kept.queue.slug == "renamed"


def test_rows_read_before_a_change_are_never_kept_under_the_stamps_after_it(
    token: tuple[IntegrationToken, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two of the gateway's threads: one notes "last used" for the rows it kept while the
    token's scopes change and the other reads and keeps the new rows. The first must not put
    its older rows back under the newer stamps."""
    record, raw = token
    assert token_authenticate(token=raw) is not None
    monkeypatch.setattr(services, "_LAST_USED_PRECISION", timedelta(0))  # noted at every call

    def now_after_a_change_and_another_call() -> datetime:
        monkeypatch.setattr(services, "timezone", timezone)  # once
        IntegrationToken.objects.filter(pk=record.pk).update(scopes=[Scope.ITEMS])
        other_thread = token_authenticate(token=raw)
        assert other_thread is not None and not other_thread.allows(Scope.GATEWAY)
        return timezone.now()

    monkeypatch.setattr(
        services, "timezone", SimpleNamespace(now=now_after_a_change_and_another_call)
    )
    first_thread = token_authenticate(token=raw)
    assert first_thread is not None and first_thread.allows(Scope.GATEWAY)  # read before

    after = token_authenticate(token=raw)
    assert after is not None and not after.allows(Scope.GATEWAY)


def test_without_the_stamps_the_database_answers_every_call(
    token: tuple[IntegrationToken, str],
    monkeypatch: pytest.MonkeyPatch,
    django_assert_num_queries: Any,
) -> None:
    record, raw = token
    assert token_authenticate(token=raw) is not None

    def unreachable(*names: str) -> tuple[str, ...]:
        raise ConnectionError("Redis is away")

    monkeypatch.setattr(counters, "stamps", unreachable)
    with django_assert_num_queries(1):
        assert token_authenticate(token=raw) == record
    # Revoked while the stamps cannot be renewed either: refused all the same.
    monkeypatch.setattr(counters, "stamp_renew", unreachable)
    IntegrationToken.objects.filter(pk=record.pk).update(revoked_at=timezone.now())
    assert token_authenticate(token=raw) is None


def test_rows_kept_longer_than_their_age_limit_are_read_again(
    token: tuple[IntegrationToken, str],
    monkeypatch: pytest.MonkeyPatch,
    django_assert_num_queries: Any,
) -> None:
    _, raw = token
    assert token_authenticate(token=raw) is not None
    monkeypatch.setattr(services, "_KEPT_FOR_S", 0.0)
    with django_assert_num_queries(1):
        assert token_authenticate(token=raw) is not None


def test_last_used_is_noted_once_a_minute_and_renews_no_stamp(
    token: tuple[IntegrationToken, str], django_assert_num_queries: Any
) -> None:
    record, raw = token
    before = counters.stamps(IntegrationToken.rows_stamp, Queue.rows_stamp)
    with django_assert_num_queries(2):  # the rows, then "last used"
        token_authenticate(token=raw)
    assert IntegrationToken.objects.get(pk=record.pk).last_used_at is not None
    assert counters.stamps(IntegrationToken.rows_stamp, Queue.rows_stamp) == before
    with django_assert_num_queries(0):  # kept, and used within the minute
        token_authenticate(token=raw)


def test_without_redis_nothing_is_kept(
    token: tuple[IntegrationToken, str], settings: Any, django_assert_num_queries: Any
) -> None:
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    _, raw = token
    assert token_authenticate(token=raw) is not None
    with django_assert_num_queries(1):
        assert token_authenticate(token=raw) is not None
