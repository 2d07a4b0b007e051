"""The database helpers, on whichever database the suite runs: the generation tasks commit
asynchronously on PostgreSQL, and only while they run (SQLite is left as it is: it already
commits without waiting for the disk); many rows' updates go in one statement."""

import sqlite3
from contextlib import closing
from typing import Any

import pytest
from django.apps import apps
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from icrlhf.generation import pipeline, tasks
from icrlhf.generation.models import Candidate
from icrlhf.generation.services import item_create
from icrlhf.integrations import counters
from icrlhf.integrations.database import (
    StampedModel,
    StampedQuerySet,
    asynchronous_commits,
    rows_update,
)
from icrlhf.queues.models import Queue
from tests.factories import QueueFactory
from tests.support.caches import cache_in_redis

pytestmark = pytest.mark.django_db


# Each database's own behaviour is asserted on that database: the suite runs on both.
on_postgresql = pytest.mark.postgresql
on_sqlite = pytest.mark.sqlite


def _synchronous_commit() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")
        return str(cursor.fetchone()[0])


@on_postgresql
def test_commits_are_asynchronous_inside_the_block_only() -> None:
    assert _synchronous_commit() == "on"
    with asynchronous_commits():
        assert _synchronous_commit() == "off"
    assert _synchronous_commit() == "on"


@on_postgresql
def test_the_server_default_comes_back_when_the_work_fails() -> None:
    with pytest.raises(RuntimeError), asynchronous_commits():
        assert _synchronous_commit() == "off"
        raise RuntimeError("the work failed")
    assert _synchronous_commit() == "on"


@on_sqlite
@pytest.mark.django_db(transaction=True)  # the block's work commits as it would in a task
def test_on_sqlite_the_block_adds_no_statement_and_its_work_is_committed(queue: Queue) -> None:
    with CaptureQueriesContext(connection) as queries, asynchronous_commits():
        Queue.objects.filter(pk=queue.pk).update(name="Renamed in the block")
    assert [query["sql"].split()[0] for query in queries] == ["UPDATE"]
    # Committed: another connection to the file reads it.
    with closing(sqlite3.connect(connection.settings_dict["NAME"])) as other:
        table = Queue._meta.db_table
        read = other.execute(f"SELECT name FROM {table} WHERE id = ?", [queue.pk])
        assert read.fetchone() == ("Renamed in the block",)


@on_sqlite
def test_on_sqlite_failing_work_passes_through_with_no_statement_of_its_own() -> None:
    with (
        CaptureQueriesContext(connection) as queries,
        pytest.raises(RuntimeError, match="the work failed"),
        asynchronous_commits(),
    ):
        raise RuntimeError("the work failed")
    assert len(queries) == 0


def test_switched_off_by_its_setting(settings: Any) -> None:
    settings.PIPELINE_ASYNCHRONOUS_COMMIT = False
    with CaptureQueriesContext(connection) as queries, asynchronous_commits():
        pass
    assert len(queries) == 0


def test_the_generation_tasks_run_their_steps_inside_it(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []

    def step(**kwargs: Any) -> None:
        seen.append(_synchronous_commit() if connection.vendor == "postgresql" else "sqlite")

    for name in ("generation_prepare", "candidates_generate", "candidate_generate"):
        monkeypatch.setattr(pipeline, name, step)
    tasks.generation_prepare.run(1)
    tasks.candidates_generate.run([1])
    tasks.candidate_generate.run(1)
    expected = "off" if connection.vendor == "postgresql" else "sqlite"
    assert seen == [expected] * 3


def test_many_rows_are_updated_in_one_statement_each_with_its_own_values(
    queue: Any, user: Any
) -> None:
    item = item_create(queue=queue, input_text="Where is my card?", created_by=user)
    first, second, taken = item.generations.get().candidates.order_by("pk")[:3]
    Candidate.objects.filter(pk__in=[first.pk, second.pk]).update(status=Candidate.Status.RUNNING)
    finished = timezone.now()

    def answer(text: str, fields: Any, tokens: int | None) -> dict[str, Any]:
        return {
            "status": Candidate.Status.DONE,
            "text": text,
            "fields": fields,
            "tool_calls": [{"name": "lookup", "arguments": "{}"}],
            "prompt_tokens": tokens,
            "cost_usd": 0.25,
            "finished_at": finished,
        }

    with CaptureQueriesContext(connection) as queries:
        updated = rows_update(
            Candidate,
            {
                first.pk: answer("It's 100% 'shipped'", {"intent": "card"}, 12),
                second.pk: answer("Tomorrow.", None, None),
                taken.pk: answer("Not mine: it is pending.", {}, 1),
            },
            where={"status": Candidate.Status.RUNNING},
        )
    assert len(queries) == 1
    assert updated == 2
    first.refresh_from_db()
    second.refresh_from_db()
    taken.refresh_from_db()
    assert (first.status, first.text, first.fields, first.prompt_tokens) == (
        Candidate.Status.DONE,
        "It's 100% 'shipped'",
        {"intent": "card"},
        12,
    )
    assert first.tool_calls == [{"name": "lookup", "arguments": "{}"}]
    assert (first.cost_usd, first.finished_at) == (0.25, finished)
    assert (second.text, second.fields, second.prompt_tokens) == ("Tomorrow.", None, None)
    assert (taken.status, taken.text) == (Candidate.Status.PENDING, "")


def test_nothing_to_update_runs_no_statement() -> None:
    with CaptureQueriesContext(connection) as queries:
        assert rows_update(Candidate, {}, where={"status": Candidate.Status.RUNNING}) == 0
    assert len(queries) == 0


def test_every_stamped_model_writes_through_a_manager_that_renews_its_stamp() -> None:
    """A stamped model without the stamped manager would let `update()` and bulk deletes
    change rows that other processes keep, without telling them."""
    stamped = [model for model in apps.get_models() if issubclass(model, StampedModel)]
    assert {model.__name__ for model in stamped} >= {"Queue", "IntegrationToken"}
    for model in stamped:
        assert isinstance(model._default_manager.all(), StampedQuerySet), model.__name__
        assert model.rows_stamp, model.__name__
    assert len({model.rows_stamp for model in stamped}) == len(stamped)


def test_rows_updated_in_one_statement_renew_their_models_stamp(settings: Any) -> None:
    cache_in_redis(settings)
    queue = QueueFactory()
    before = counters.stamps(Queue.rows_stamp)
    assert rows_update(Queue, {queue.pk: {"name": "Renamed"}}, where={}) == 1
    assert counters.stamps(Queue.rows_stamp) != before
