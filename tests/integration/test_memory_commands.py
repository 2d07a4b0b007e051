"""memory_check and reindex run in the worker that owns the store (its Qdrant local folder),
answering through the result backend on the real Redis."""

from typing import Any

import pytest
from django.core.management import call_command

from icrlhf.memory.models import Example
from icrlhf.review.decisions import decision_record
from tests.factories import ItemFactory, QueueFactory, UserFactory, ready_generation
from tests.support.processes import WorkerProcess
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_memory_check_finds_an_example_never_indexed_and_reindex_repairs_it(
    worker_process: WorkerProcess, capsys: Any
) -> None:
    reviewer = UserFactory()
    queue = QueueFactory(members=[reviewer])
    item = ItemFactory(queue=queue, input_text="My card has not arrived.")
    generation = ready_generation(item, ["It ships soon.", "No idea."])
    decision = decision_record(
        item_id=item.pk,
        reviewer=reviewer,
        verdict="chosen",
        candidate_id=generation.candidates.get(text="It ships soon.").pk,
    )
    wait_for(lambda: not Example.objects.exclude(index_state="indexed").exists(), what="index")
    call_command("memory_check", queue=queue.slug)
    assert f"{queue.slug}: 2 examples, 2 points, 0 missing" in capsys.readouterr().out

    never = Example.objects.create(  # as if its index task had been lost
        queue=queue,
        decision=decision,
        input_text="Lost task",
        output_text="?",
        reward=1.0,
        role="preferred",
        index_state="indexed",
    )
    with pytest.raises(SystemExit) as exit_info:
        call_command("memory_check", queue=queue.slug)
    assert exit_info.value.code == 1
    out = capsys.readouterr().out
    assert "1 missing in the store" in out and str(never.pk) in out and "Drift found." in out

    call_command("reindex", queue=queue.slug)
    assert f"{queue.slug}: 3 examples re-indexed" in capsys.readouterr().out
    call_command("memory_check", queue=queue.slug)
    assert "No drift." in capsys.readouterr().out
