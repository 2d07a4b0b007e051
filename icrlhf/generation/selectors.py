import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from django.db.models import QuerySet

from icrlhf.generation.models import Candidate, Generation
from icrlhf.generation.prompts import Attempt, PromptExample
from icrlhf.memory import selectors as memory_selectors
from icrlhf.memory.models import Example, Retrieval
from icrlhf.memory.selectors import RetrievedExample
from icrlhf.memory.signatures import action_text
from icrlhf.queues.models import Item, Queue

# A "try again" prompt carries at most this many earlier attempts (the latest ones): the
# paper keeps them all, a prompt has a budget.
MAX_ATTEMPTS = 12


@dataclass(frozen=True)
class Progress:
    ready: int
    total: int


def generation_latest(*, item: Item) -> Generation | None:
    return item.generations.order_by("-created_at").first()


def generation_candidates(*, generation: Generation) -> QuerySet[Candidate]:
    return generation.candidates.select_related("source_example__decision").order_by("position")


def generation_progress(*, generation: Generation) -> Progress:
    candidates = list(generation.candidates.values_list("status", flat=True))
    settled = [s for s in candidates if s in {Candidate.Status.DONE, Candidate.Status.FAILED}]
    return Progress(ready=len(settled), total=len(candidates))


@dataclass(frozen=True)
class BelowMinimum:
    example: Example
    score: float


@dataclass(frozen=True)
class Retrievals:
    """What a generation's retrieval found: the examples in its prompt, best first, and those
    its queue's minimum similarity (`minimum`, None before retrieval) kept out."""

    used: list[Retrieval]
    below_minimum: list[BelowMinimum]
    minimum: float | None


def generation_retrievals(*, generation: Generation) -> Retrievals:
    recorded = generation.below_minimum or []
    rows = Example.objects.select_related("decision").in_bulk(
        [entry["example"] for entry in recorded]
    )
    return Retrievals(
        used=list(generation.retrievals.select_related("example__decision__item").order_by("rank")),
        # An example deleted since is no longer shown.
        below_minimum=[
            BelowMinimum(example=rows[uuid.UUID(entry["example"])], score=entry["score"])
            for entry in recorded
            if uuid.UUID(entry["example"]) in rows
        ],
        minimum=generation.min_similarity,
    )


def prompt_examples(*, queue: Queue, retrieved: Sequence[RetrievedExample]) -> list[PromptExample]:
    """The retrieved examples as the prompt sends them: with their rewards and their rivals'
    when the queue puts rewards beside examples."""
    examples = [r.example for r in retrieved]
    if not queue.example_rewards:
        return [PromptExample.of(example) for example in examples]
    rivals = memory_selectors.examples_rivals(examples=examples)
    return [
        PromptExample.of(example, rewarded=True, rivals=rivals[example.pk]) for example in examples
    ]


@dataclass(frozen=True)
class Attempts:
    """A "try again" round's context: the item's earlier answers with their rewards, oldest
    first, and what the reviewers said about them."""

    attempts: list[Attempt]
    feedback: str


def attempts_earlier(*, item: Item, before: Generation) -> Attempts:
    """The answers already rewarded when `before` is generated: those of the item's earlier
    rounds that a reviewer sent back with "try again", and the answer the application was
    served and rewarded low (a low-reward capture, in this round). Each text once (its latest
    reward), the latest MAX_ATTEMPTS."""
    rounds = item.generations.filter(created_at__lt=before.created_at, try_again__isnull=False)
    rewards: dict[str, float] = {}
    said: list[str] = []
    for generation in rounds.order_by("created_at"):
        verdict = generation.try_again or {}
        given = verdict.get("rewards", {})
        for candidate in generation.candidates.filter(status=Candidate.Status.DONE).order_by(
            "position"
        ):
            text = action_text(candidate.text, candidate.tool_calls).strip()
            if text:
                rewards.pop(text, None)  # re-inserted: the latest round orders it
                rewards[text] = float(given.get(str(candidate.pk), 0.0))
        reasons = ", ".join(verdict.get("reasons", []))
        comment = str(verdict.get("comment", "")).strip()
        said.append(" — ".join(part for part in (reasons, comment) if part))
    served = (
        before.candidates.filter(served=True, reward__isnull=False)
        .values_list("text", "tool_calls", "reward")
        .first()
    )
    if served is not None:
        text, tool_calls, reward = served
        given = float(reward or 0.0)
        rewards.pop(action_text(text, tool_calls).strip(), None)
        rewards[action_text(text, tool_calls).strip()] = given
        said.append(f"the application rewarded the answer it was served {given:.2f}")
    attempts = [Attempt(text, reward) for text, reward in rewards.items()][-MAX_ATTEMPTS:]
    return Attempts(attempts=attempts, feedback="; ".join(s for s in said if s))
