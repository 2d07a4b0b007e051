import uuid
from dataclasses import dataclass

from django.db.models import QuerySet

from icrlhf.generation.models import Candidate, Generation
from icrlhf.memory.models import Example, Retrieval
from icrlhf.queues.models import Item


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
