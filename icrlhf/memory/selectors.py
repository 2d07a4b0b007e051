import math
from dataclasses import dataclass

from icrlhf.integrations import embeddings, llm, vectors
from icrlhf.memory.models import Example
from icrlhf.queues.models import Queue

# Two retrieved examples closer than this say the same thing: keep the better-ranked one.
NEAR_DUPLICATE_COSINE = 0.95
# Ask the store for more than k, so that pinned, duplicate and stale hits can be dropped.
_OVERFETCH = 4


@dataclass(frozen=True)
class RetrievedExample:
    example: Example
    score: float
    rank: int


def _cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    norms = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return dot / norms if norms else 0.0


def examples_retrieve(
    *, queue: Queue, query_text: str, k: int, token_budget: int
) -> list[RetrievedExample]:
    """The queue's preferred, non-retired examples most similar to the query, best first.

    Pinned examples come first; near-duplicates are dropped; whole examples are added until
    the next one would exceed the token budget (an example is never cut).
    """
    if k <= 0:
        return []
    hits = vectors.search(
        collection=vectors.collection_name(queue.slug),
        vector=embeddings.embed_text(query_text),
        limit=k * _OVERFETCH,
        min_score=queue.min_similarity,
        match={
            "role": [Example.Role.PREFERRED],
            "status": [Example.Status.ACTIVE, Example.Status.PINNED],
        },
    )
    # The database is the source of truth: a point whose row is gone or retired is stale.
    rows = Example.objects.in_bulk([hit.id for hit in hits])
    live = [
        (hit, rows[hit.id])
        for hit in hits
        if hit.id in rows
        and rows[hit.id].role == Example.Role.PREFERRED
        and rows[hit.id].status != Example.Status.RETIRED
    ]
    live.sort(key=lambda pair: (pair[1].status != Example.Status.PINNED, -pair[0].score))

    kept: list[tuple[vectors.Hit, Example]] = []
    for hit, example in live:
        if any(_cosine(hit.vector, other.vector) > NEAR_DUPLICATE_COSINE for other, _ in kept):
            continue
        kept.append((hit, example))
        if len(kept) == k:
            break

    chosen: list[RetrievedExample] = []
    used_tokens = 0
    for hit, example in kept:
        tokens = llm.count_tokens(example.input_text) + llm.count_tokens(example.output_text)
        if used_tokens + tokens > token_budget:
            break
        used_tokens += tokens
        chosen.append(RetrievedExample(example=example, score=hit.score, rank=len(chosen) + 1))
    return chosen
