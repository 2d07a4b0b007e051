"""Runs stored before a change of shape keep working after it."""

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from icrlhf.gateway.models import Call
from icrlhf.ingest.services import token_create
from icrlhf.trajectories.models import Trajectory
from icrlhf.trajectories.services import end_user_key
from tests.factories import QueueFactory, agent_step

BEFORE = [("trajectories", "0004_run_owner")]


def migrated(targets: list[tuple[str, str]]) -> MigrationExecutor:
    executor = MigrationExecutor(connection)
    executor.migrate(targets)
    executor.loader.build_graph()
    return executor


@pytest.mark.django_db(transaction=True)
def test_a_run_stored_with_its_end_users_id_goes_on_under_the_keyed_hash() -> None:
    """An end user's id stored as sent becomes the keyed hash their next call is matched by
    (so the run goes on, and the id is gone); the run's low-reward captures so far count."""
    queue = QueueFactory()
    token, _ = token_create(queue=queue, name="agent")
    asked = [{"role": "user", "content": "Where is order 4821?"}]
    first = agent_step(queue, asked, key="order-4821", text="Looking.", token=token)
    Call.objects.create(
        queue=queue,
        token=token,
        source=Call.Source.MODEL,
        memory=Call.Memory.EMPTY,
        request_text="Where is order 4821?",
        capture=Call.Capture.LOW_REWARD,
    )
    step = first.step
    step.call = Call.objects.get()
    step.save(update_fields=["call"])

    old = migrated(BEFORE).loader.project_state(BEFORE).apps.get_model("trajectories", "Trajectory")
    old.objects.filter(pk=first.trajectory.pk).update(end_user="ana-42")  # as it was stored
    migrated(MigrationExecutor(connection).loader.graph.leaf_nodes())  # 0006, and all later

    run = Trajectory.objects.get()
    assert run.end_user == end_user_key("ana-42") and run.low_reward_captures == 1
    again = agent_step(
        queue,
        [*asked, {"role": "assistant", "content": "Looking."}, {"role": "user", "content": "?"}],
        key="order-4821",
        text="Shipped.",
        token=token,
        end_user="ana-42",
    )
    assert again.trajectory == run
