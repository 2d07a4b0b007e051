import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction

from icrlhf.memory import curation, index_tasks, signatures
from icrlhf.memory.models import Example, Retrieval
from icrlhf.memory.selectors import RetrievedExample

logger = logging.getLogger(__name__)

PREFERRED_REWARD = 1.0
REJECTED_REWARD = 0.0
# A reviewer's optional rating of a candidate, 1 (worst) … 5 (best).
RATINGS = range(1, 6)


def rating_reward(rating: int) -> float:
    """A rating as a reward on memory's scale: 1 → 0.0, 3 → 0.5, 5 → 1.0."""
    return (rating - RATINGS.start) / (RATINGS.stop - 1 - RATINGS.start)


@dataclass(frozen=True)
class ExampleDraft:
    """One answer a decision teaches: the candidate it came from (none for a reviewer's own
    text) and the text later prompts will show."""

    candidate_id: int | None
    output_text: str
    # An agent's step: the action's tool calls (output_text then renders them too).
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    # Its reward when the reviewer gave one (a rating, a "try again"); else its role's.
    reward: float | None = None


def examples_record(
    *,
    decision_id: int,
    queue_id: int,
    input_text: str,
    preferred: ExampleDraft | None,
    rejected: Sequence[ExampleDraft],
    conversation: Sequence[dict[str, Any]] = (),
    call_options: dict[str, Any] | None = None,
) -> list[Example]:
    """Store what a decision teaches as rewarded examples (preferred 1.0, rejected 0.0, or
    the reward the reviewer gave a draft) and index them once the decision commits. Must run
    inside the decision's transaction.

    A step made with tools (an agent's, captured from the gateway) keeps its signature and
    its turns: the caller's conversation, then the action."""
    options = call_options or {}
    names = signatures.tool_names(options.get("tools"))
    output_format = signatures.output_format(options)
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
            output_text=signatures.action_text(draft.output_text, draft.tool_calls),
            reward=reward if draft.reward is None else draft.reward,
            role=role,
            tool_names=names,
            output_format=output_format,
            turns=_turns(conversation, draft) if names else [],
        )
        for draft, reward, role in drafts
    )
    example_ids = [str(example.pk) for example in examples]
    # robust: with the broker down the decision still succeeds; the examples stay pending and
    # the memory sweeper indexes them once the broker is back.
    transaction.on_commit(lambda: index_tasks.examples_index.delay(example_ids), robust=True)
    return examples


@dataclass(frozen=True)
class RewardedStep:
    """An agent's step the application rewarded: the state it decided from, its action, and
    the reward, with the signature it was made under."""

    step_id: int
    input_text: str  # the decision point
    action_text: str
    tool_calls: list[dict[str, Any]]
    conversation: list[dict[str, Any]]  # the turns before the action
    tool_names: list[str]
    output_format: dict[str, Any]
    reward: float
    preferred: bool
    # The results its tool calls got (the next step's tool messages), where known.
    results: list[dict[str, Any]] = field(default_factory=list)


def rewarded_steps_record(*, queue_id: int, steps: Sequence[RewardedStep]) -> list[Example]:
    """Store rewarded steps as examples (preferred or rejected, with the application's
    reward) and index them once the feedback commits. A step already stored is left as it
    is: the first reward that reached memory stands, as a reviewer's decision does (and a
    correction of the step stands over any reward)."""
    stored = set(
        Example.objects.filter(step_id__in=[s.step_id for s in steps]).values_list(
            "step_id", flat=True
        )
    )
    examples = Example.objects.bulk_create(
        _step_example(queue_id, step) for step in steps if step.step_id not in stored
    )
    _index_on_commit(examples)
    return examples


@dataclass(frozen=True)
class StepCorrection:
    """An application's correction of an agent's step (feedback on its call with a
    corrected_action): the action it says was right, and the one the gateway served."""

    feedback_id: uuid.UUID
    feedback_at: datetime  # when the correction was posted: a later one replaces it
    corrected: RewardedStep  # preferred
    served: RewardedStep  # rejected, with the feedback's reward


def step_correction_record(*, queue_id: int, correction: StepCorrection) -> list[Example]:
    """Store a correction as the step's examples: the corrected action preferred, the served
    one its rejected rival. What the step taught before (a reward, an earlier correction) is
    retired with the reason, as a curator's retire is; one a curator pinned keeps its pin.
    Once per correction: stored already, or replaced by a later correction of the step, it
    stores nothing. Must run inside the
    feedback's (or the approval's) transaction."""
    step_id = correction.served.step_id
    # Locked: two corrections of one step at once replace each other in turn (PostgreSQL;
    # SQLite writes one transaction at a time).
    earlier = list(Example.objects.select_for_update().filter(step_id=step_id))
    replaced_later = Example.objects.filter(
        step_id=step_id, feedback__created_at__gt=correction.feedback_at
    ).exists()
    if replaced_later or any(e.feedback_id == correction.feedback_id for e in earlier):
        return []
    curation.examples_status_set(
        # A curator's pin stands: only what the step taught on its own is replaced.
        ids=[e.pk for e in earlier if e.status == Example.Status.ACTIVE],
        status=Example.Status.RETIRED,
        actor=None,
        reason=f"Replaced by the application's correction of the step (feedback "
        f"{correction.feedback_id}).",
    )
    examples = Example.objects.bulk_create(
        _step_example(queue_id, step, feedback_id=correction.feedback_id)
        for step in (correction.corrected, correction.served)
    )
    _index_on_commit(examples)
    return examples


def _step_example(
    queue_id: int, step: RewardedStep, *, feedback_id: uuid.UUID | None = None
) -> Example:
    return Example(
        queue_id=queue_id,
        step_id=step.step_id,
        feedback_id=feedback_id,
        input_text=step.input_text,
        output_text=signatures.action_text(step.action_text, step.tool_calls),
        reward=step.reward,
        role=Example.Role.PREFERRED if step.preferred else Example.Role.REJECTED,
        tool_names=step.tool_names,
        output_format=step.output_format,
        # As a decision's: a step made with tools is kept as turns.
        turns=[
            *_turns(step.conversation, ExampleDraft(None, step.action_text, step.tool_calls)),
            *step.results,
        ]
        if step.tool_names
        else [],
    )


def _index_on_commit(examples: Sequence[Example]) -> None:
    example_ids = [str(example.pk) for example in examples]
    if example_ids:
        transaction.on_commit(lambda: index_tasks.examples_index.delay(example_ids), robust=True)


def _turns(conversation: Sequence[dict[str, Any]], draft: ExampleDraft) -> list[dict[str, Any]]:
    """The step as OpenAI turns: the conversation (the caller's system text is its own, not
    the step's), then the action."""
    action = signatures.action_message(draft.output_text, draft.tool_calls)
    turns = [turn for turn in conversation if turn.get("role") in ("user", "assistant", "tool")]
    return [*turns, action]


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
        Retrieval(
            generation_id=generation_id,
            example=r.example,
            score=r.score,
            rank=r.rank,
            format_only=r.format_only,
        )
        for r in retrieved
    )
