"""Migration 0022: a queue's boolean `format_examples` becomes `format_examples_from`. A queue
that sent them keeps them, from each token's own calls (never every token's: that is a
curator's choice); one that did not stays off."""

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from icrlhf.queues.models import Queue

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
    MigrationExecutor(connection).migrate(AFTER)
