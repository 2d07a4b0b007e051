"""The queue's format examples setting: migration 0022 turns the boolean `format_examples` into
`format_examples_from` (a queue that sent them keeps them, from each token's own calls, never
every token's: that is a curator's choice; one that did not stays off); a new queue starts at
the token's own; the queue's page says what each choice shares."""

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.test import Client

from icrlhf.queues.models import Queue
from tests.factories import QueueFactory, UserFactory

BEFORE = [("queues", "0021_queue_format_examples")]
AFTER = [("queues", "0022_queue_format_examples_from")]


@pytest.mark.django_db(transaction=True)
def test_the_boolean_maps_to_the_safe_setting_and_back() -> None:
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    old = executor.loader.project_state(BEFORE).apps.get_model("queues", "Queue")
    old.objects.create(slug="on", name="on", format_examples=True)
    old.objects.create(slug="off", name="off", format_examples=False)

    executor = MigrationExecutor(connection)
    executor.migrate(AFTER)
    assert dict(Queue.objects.values_list("slug", "format_examples_from")) == {
        "on": Queue.FormatExamples.TOKEN,
        "off": Queue.FormatExamples.OFF,
    }

    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    old = executor.loader.project_state(BEFORE).apps.get_model("queues", "Queue")
    assert dict(old.objects.values_list("slug", "format_examples")) == {"on": True, "off": False}
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())  # as the other tests expect it


@pytest.mark.django_db
def test_a_new_queue_sends_no_format_examples() -> None:
    """The default model calls tools on its own; shown other tool sets' calls it called less
    often (docs/benchmarks.md): a queue turns them on for a model that cannot."""
    assert Queue.objects.create(slug="new", name="new").format_examples_from == "off"


@pytest.mark.django_db
def test_the_queues_page_says_what_each_choice_shares() -> None:
    queue = QueueFactory()
    client = Client()
    client.force_login(UserFactory(is_staff=True, is_superuser=True))
    page = client.get(f"/admin/queues/queue/{queue.pk}/change/").content.decode()
    assert '<select name="format_examples_from"' in page
    for said in (
        "from the calls of the calling token only",
        "shares only the form of tool calls: tool and argument names, never words or values",
        "the minimum similarity does not apply to them",
    ):
        assert said in page.replace("&#x27;", "'")
