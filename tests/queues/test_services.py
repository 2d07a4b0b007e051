"""Queue settings: an edit of the guidelines is a new version (decisions record the version
they were made under); other edits keep it."""

from typing import Any

from icrlhf.queues.models import Queue
from icrlhf.queues.services import queue_save


def test_editing_the_guidelines_starts_a_new_version_and_other_edits_do_not(db: Any) -> None:
    queue = queue_save(queue=Queue(slug="billing", name="Billing", guidelines="Be brief."))
    assert queue.guidelines_version == 1

    queue.name = "Billing questions"
    queue_save(queue=queue)
    assert Queue.objects.get(pk=queue.pk).guidelines_version == 1

    queue.guidelines = "Be brief. Quote the fee schedule."
    queue_save(queue=queue)
    assert Queue.objects.get(pk=queue.pk).guidelines_version == 2


def test_a_stale_copy_cannot_take_the_version_back(db: Any) -> None:
    queue = queue_save(queue=Queue(slug="cards", name="Cards", guidelines="v1"))
    stale = Queue.objects.get(pk=queue.pk)
    queue.guidelines = "v2"
    queue_save(queue=queue)
    stale.guidelines = "v3"
    queue_save(queue=stale)
    assert Queue.objects.get(pk=queue.pk).guidelines_version == 3
