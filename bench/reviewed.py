"""Memory seeded the way a reviewer fills it, for the benchmarks: an item's one candidate,
the known-right answer, picked by a reviewer (the decision stores the example, the worker
indexes it), and waiting until every example is indexed."""

import time
from collections.abc import Sequence
from typing import Any

from django.contrib.auth.models import User

from icrlhf.generation.models import Candidate, Generation
from icrlhf.memory.models import Example
from icrlhf.queues.models import Item, Queue
from icrlhf.review.decisions import decision_record


def answer_chosen(
    item: Item,
    *,
    model: str,
    reviewer: User,
    text: str = "",
    tool_calls: Sequence[dict[str, Any]] = (),
    fields: dict[str, Any] | None = None,
) -> None:
    """`item`'s one candidate (`model` names where the answer came from: an expert, a gold
    trajectory), the given answer, chosen by `reviewer` through the review flow's own path."""
    generation = Generation.objects.create(
        item=item, model=model, params={}, n_candidates=1, status=Generation.Status.DONE
    )
    candidate = Candidate.objects.create(
        generation=generation,
        position=0,
        status=Candidate.Status.DONE,
        text=text,
        tool_calls=list(tool_calls),
        fields=fields,
    )
    decision_record(item_id=item.pk, reviewer=reviewer, verdict="chosen", candidate_id=candidate.pk)


def examples_indexed(queues: Sequence[Queue], *, timeout_s: float) -> None:
    """Wait until every example of `queues` is in the store (the worker indexes them)."""
    deadline = time.monotonic() + timeout_s
    pending = Example.objects.filter(queue__in=queues).exclude(
        index_state=Example.IndexState.INDEXED
    )
    while pending.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{pending.count()} examples still not indexed")
        time.sleep(0.5)
