"""Calls and review items stored before a change of shape keep working after it."""

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from icrlhf.gateway.models import Call
from icrlhf.queues.models import Item
from icrlhf.trajectories.services import end_user_key
from tests.factories import ItemFactory, QueueFactory

BEFORE = ("gateway", "0005_call_memory_confidence")
AFTER = ("gateway", "0006_call_options_end_users_keyed")
TOOLS = [{"type": "function", "function": {"name": "mail"}}]


@pytest.mark.django_db(transaction=True)
def test_end_users_ids_leave_the_options_of_calls_and_items_stored_before() -> None:
    """A call logged before kept its end user's id in its options as sent, and its review
    item a copy: the call keeps the keyed hash new calls store, the item no end user at all,
    both their tools; retention kept forever (CALL_RETENTION_DAYS=0) would never do it."""
    queue = QueueFactory()
    item = ItemFactory(queue=queue)
    call = Call.objects.create(
        queue=queue, source=Call.Source.MODEL, memory=Call.Memory.EMPTY, item=item
    )
    executor = MigrationExecutor(connection)
    # Every app as it is now, but the gateway's migration under test not applied.
    before = [BEFORE if leaf == AFTER else leaf for leaf in executor.loader.graph.leaf_nodes()]
    executor.migrate([BEFORE])
    old = executor.loader.project_state(before).apps
    old.get_model("gateway", "Call").objects.filter(pk=call.pk).update(
        options={"user": "ana-42", "tools": TOOLS}
    )
    old.get_model("queues", "Item").objects.filter(pk=item.pk).update(
        call_options={"user": "ana-42", "tools": TOOLS}
    )
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes())  # AFTER, and every later migration

    assert Call.objects.get(pk=call.pk).options == {"user": end_user_key("ana-42"), "tools": TOOLS}
    assert Item.objects.get(pk=item.pk).call_options == {"tools": TOOLS}
