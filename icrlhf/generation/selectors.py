from dataclasses import dataclass

from django.db.models import QuerySet

from icrlhf.generation.models import Candidate, Generation
from icrlhf.memory.models import Retrieval
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


def generation_retrievals(*, generation: Generation) -> QuerySet[Retrieval]:
    return generation.retrievals.select_related("example__decision__item").order_by("rank")
