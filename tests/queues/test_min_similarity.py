"""The queue's minimum similarity as a setting: its measured default, the migration that
brings queues left at the old default to it, and where a curator edits it."""

import importlib
from typing import Any

from django.apps import apps
from django.test import Client

from icrlhf.queues.models import DEFAULT_MIN_SIMILARITY, Queue
from tests.factories import QueueFactory, UserFactory

migration = importlib.import_module("icrlhf.queues.migrations.0009_queue_min_similarity_measured")


def test_a_new_queue_starts_at_the_measured_minimum(db: Any) -> None:
    assert Queue.objects.create(slug="new", name="New").min_similarity == DEFAULT_MIN_SIMILARITY
    [altered] = [op for op in migration.Migration.operations if hasattr(op, "field")]
    assert altered.name == "min_similarity"
    assert altered.field.default == migration.MEASURED_DEFAULT == DEFAULT_MIN_SIMILARITY


def test_the_migration_moves_queues_left_at_the_old_default_and_keeps_chosen_ones(
    db: Any,
) -> None:
    untouched = QueueFactory(min_similarity=migration.PREVIOUS_DEFAULT)
    chosen = QueueFactory(min_similarity=0.65)
    migration.queues_at_the_old_default_move(apps, None)
    untouched.refresh_from_db()
    chosen.refresh_from_db()
    assert untouched.min_similarity == migration.MEASURED_DEFAULT
    assert chosen.min_similarity == 0.65


def test_a_curator_edits_the_minimum_in_the_queues_admin_page(db: Any) -> None:
    queue = QueueFactory()
    client = Client()
    client.force_login(UserFactory(is_staff=True, is_superuser=True))
    page = client.get(f"/admin/queues/queue/{queue.pk}/change/").content.decode()
    assert 'name="min_similarity"' in page and "Minimum similarity" in page
