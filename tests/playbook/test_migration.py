"""Guidelines written before playbooks become the first version, numbered as they were
(decisions name that number), and come back as guidelines when the migration is undone."""

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from icrlhf.playbook.models import Version
from icrlhf.playbook.selectors import playbook_in_force
from icrlhf.queues.models import Queue

BEFORE = [("queues", "0023_format_examples_off_by_default")]
# Back: the guidelines return with the playbook's data migration undone (its first).
UNDONE = [*BEFORE, ("playbook", "0001_initial")]


@pytest.mark.django_db(transaction=True)
def test_guidelines_become_the_first_version_and_back() -> None:
    executor = MigrationExecutor(connection)
    executor.migrate([*BEFORE, ("playbook", None)])
    old = executor.loader.project_state(BEFORE).apps.get_model("queues", "Queue")
    old.objects.create(
        slug="cards",
        name="Cards",
        guidelines="Be correct.\n\n## Cards\n- Ask for the last four digits.",
        guidelines_version=3,
    )
    old.objects.create(slug="empty", name="Empty", guidelines="")

    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())  # 0024, and every later migration
    cards = Queue.objects.get(slug="cards")
    version = Version.objects.get(queue=cards)
    assert (version.number, version.origin) == (3, Version.Origin.GUIDELINES)
    assert playbook_in_force(cards).text == (
        "Cards:\n- Ask for the last four digits.\nGuidelines:\n- Be correct."
    )
    assert not Version.objects.filter(queue__slug="empty").exists()

    executor = MigrationExecutor(connection)
    executor.migrate(UNDONE)
    old = executor.loader.project_state(UNDONE).apps.get_model("queues", "Queue")
    back = old.objects.get(slug="cards")
    assert back.guidelines_version == 3
    assert (
        back.guidelines
        == "## Cards\n- Ask for the last four digits.\n\n## Guidelines\n- Be correct."
    )
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())
