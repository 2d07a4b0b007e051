import math
from dataclasses import dataclass

from icrlhf.integrations import embeddings, llm, vectors
from icrlhf.memory import index
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


@dataclass(frozen=True)
class Recall:
    examples: list[RetrievedExample]  # for the prompt: top k, whole, within the token budget
    neighbours: list[RetrievedExample]  # up to `pool` live preferred examples, nearest first


def examples_recall(
    *, queue: Queue, query_text: str, k: int, token_budget: int, pool: int = 0
) -> Recall:
    """The queue's preferred examples for a query.

    For the prompt: pinned examples always come first (a curator pinned them to be in every
    prompt); then the most similar active ones, ranked by similarity × weight, without
    near-duplicates. Whole examples are added until the next one would exceed the token budget
    (never cut). Neighbours: the `pool` nearest pinned or active examples by the same ranking,
    duplicates kept, for offering their answers as candidates.
    """
    if k <= 0 and pool <= 0:
        return Recall(examples=[], neighbours=[])
    collection = index.collection_of(queue.slug)
    vector = embeddings.embed_text(query_text)
    pinned = list(
        Example.objects.filter(
            queue=queue, role=Example.Role.PREFERRED, status=Example.Status.PINNED
        ).order_by("created_at")[: max(k, pool)]
    )
    pinned_scores = vectors.search_among(
        collection=collection, vector=vector, ids=[e.pk for e in pinned]
    )
    pinned.sort(key=lambda e: -pinned_scores.get(e.pk, 0.0))
    hits = vectors.search(
        collection=collection,
        vector=vector,
        limit=max(k * _OVERFETCH, pool),
        match={"role": [Example.Role.PREFERRED], "status": [Example.Status.ACTIVE]},
        min_score=queue.min_similarity,
    )
    # The database is the source of truth: a point whose row is gone or changed is stale.
    rows = Example.objects.in_bulk([hit.id for hit in hits])
    live = [
        (hit, rows[hit.id])
        for hit in hits
        if hit.id in rows
        and rows[hit.id].role == Example.Role.PREFERRED
        and rows[hit.id].status == Example.Status.ACTIVE
    ]
    live.sort(key=lambda pair: -pair[0].score * pair[1].weight)

    ranked: list[tuple[float, Example]] = [(pinned_scores.get(e.pk, 0.0), e) for e in pinned[:k]]
    kept_vectors: list[list[float]] = []
    for hit, example in live:
        if len(ranked) >= k:
            break
        if any(_cosine(hit.vector, other) > NEAR_DUPLICATE_COSINE for other in kept_vectors):
            continue
        kept_vectors.append(hit.vector)
        ranked.append((hit.score, example))

    nearest = [(pinned_scores[e.pk], e.weight, e) for e in pinned if e.pk in pinned_scores]
    nearest += [(hit.score, example.weight, example) for hit, example in live]
    nearest.sort(key=lambda triple: -triple[0] * triple[1])
    neighbours = [
        RetrievedExample(example=example, score=score, rank=rank)
        for rank, (score, _, example) in enumerate(nearest[:pool], start=1)
    ]
    return Recall(examples=_within_budget(ranked, token_budget), neighbours=neighbours)


def _within_budget(
    ranked: list[tuple[float, Example]], token_budget: int
) -> list[RetrievedExample]:
    chosen: list[RetrievedExample] = []
    used_tokens = 0
    for score, example in ranked:
        tokens = llm.count_tokens(example.input_text) + llm.count_tokens(example.output_text)
        if used_tokens + tokens > token_budget:
            break
        used_tokens += tokens
        chosen.append(RetrievedExample(example=example, score=score, rank=len(chosen) + 1))
    return chosen
