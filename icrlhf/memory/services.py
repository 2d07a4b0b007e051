import logging
from collections.abc import Sequence
from dataclasses import dataclass

from django.contrib.auth.models import User
from django.db import transaction

from icrlhf.memory import curation, tasks
from icrlhf.memory.models import Example, Retrieval
from icrlhf.memory.selectors import RetrievedExample

logger = logging.getLogger(__name__)

PREFERRED_REWARD = 1.0
REJECTED_REWARD = 0.0


@dataclass(frozen=True)
class ExampleDraft:
    """One answer a decision teaches: the candidate it came from (none for a reviewer's own
    text) and the text later prompts will show."""

    candidate_id: int | None
    output_text: str


def examples_record(
    *,
    decision_id: int,
    queue_id: int,
    input_text: str,
    preferred: ExampleDraft | None,
    rejected: Sequence[ExampleDraft],
) -> list[Example]:
    """Store what a decision teaches as rewarded examples (preferred 1.0, rejected 0.0) and
    index them once the decision commits. Must run inside the decision's transaction."""
    drafts = (
        [(preferred, PREFERRED_REWARD, Example.Role.PREFERRED)] if preferred is not None else []
    )
    drafts += [(draft, REJECTED_REWARD, Example.Role.REJECTED) for draft in rejected]
    examples = Example.objects.bulk_create(
        Example(
            queue_id=queue_id,
            decision_id=decision_id,
            candidate_id=draft.candidate_id,
            input_text=input_text,
            output_text=draft.output_text,
            reward=reward,
            role=role,
        )
        for draft, reward, role in drafts
    )
    example_ids = [str(example.pk) for example in examples]
    # robust: with the broker down the decision still succeeds; the examples stay pending and
    # the memory sweeper indexes them once the broker is back.
    transaction.on_commit(lambda: tasks.examples_index.delay(example_ids), robust=True)
    return examples


def examples_withdraw(*, decision_id: int, actor: User | None) -> None:
    """An undone decision's examples leave the memory: retired with the reason and an audit
    event, like a curator's retire (retrieval skips them; a curator may restore them)."""
    ids = list(Example.objects.filter(decision_id=decision_id).values_list("pk", flat=True))
    curation.examples_status_set(
        ids=ids,
        status=Example.Status.RETIRED,
        actor=actor,
        reason=f"Withdrawn: decision {decision_id} was undone.",
    )


def retrievals_record(*, generation_id: int, retrieved: Sequence[RetrievedExample]) -> None:
    Retrieval.objects.bulk_create(
        Retrieval(generation_id=generation_id, example=r.example, score=r.score, rank=r.rank)
        for r in retrieved
    )
