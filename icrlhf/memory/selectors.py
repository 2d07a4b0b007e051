import json
import uuid
from dataclasses import dataclass, field, replace
from typing import Any

from django.conf import settings
from django.db.models import Q, QuerySet

from icrlhf.integrations import embeddings, llm, vectors
from icrlhf.integrations.vectors import VectorStoreUnavailable
from icrlhf.memory import index, remote_recall
from icrlhf.memory.models import Example
from icrlhf.memory.signatures import PLAIN, Signature, step_action
from icrlhf.queues.models import Queue

# Ask the store for more than k, so that pinned, duplicate and stale hits can be dropped.
_OVERFETCH = 4
# Without a filter, ask for this many times more again: each decision stores its rejected
# answers (3 with the default 4 candidates) at the same point of the space as its preferred
# one. A neighbourhood more crowded than that falls back to the exact, filtered search.
_CROWDING = 4

# Search hits with their examples' rows.
_Hits = list[tuple[vectors.Hit, Example]]


@dataclass(frozen=True)
class RetrievedExample:
    example: Example
    score: float
    rank: int
    # A format example: a tool call of another tool set, in the prompt to show how a call is
    # written (the queue's `format_examples_from`), never which tool to call; the prompt
    # carries only the call's form (`generation.prompts.call_form`).
    format_only: bool = False


@dataclass(frozen=True)
class Recall:
    examples: list[RetrievedExample]  # for the prompt: top k, whole, within the token budget
    neighbours: list[RetrievedExample]  # up to `pool` live preferred examples, nearest first
    # Examples that would have been among the top k but for the queue's minimum similarity:
    # never used, kept so that a reviewer can see what the minimum left out.
    below_minimum: list[RetrievedExample] = field(default_factory=list)
    minimum: float | None = None  # the minimum similarity applied (None: nothing retrieved)
    # Up to `pool` active rejected examples at or above the minimum, nearest first: answers
    # reviewers turned down for similar requests, which the ranking counts as votes against.
    rejected: list[RetrievedExample] = field(default_factory=list)


def examples_recall(
    *,
    queue: Queue,
    query_text: str,
    k: int,
    token_budget: int,
    pool: int = 0,
    signature: Signature = PLAIN,
    vector: list[float] | None = None,
    preferred: int | None = None,
    token_id: int | None = None,
) -> Recall:
    """The queue's preferred examples for a query (`vector`: its embedding, when the caller
    embedded it already, as one of a batch; `preferred`: how many the queue holds, when the
    caller counted them, which saves asking whether it holds any; `token_id`: the token the
    request came with, None for one that came with none).

    For the prompt: pinned examples always come first (a curator pinned them to be in every
    prompt); then the most similar active ones, ranked by similarity × weight, without
    near-duplicates and none below the queue's minimum similarity. Whole examples are added
    until the next one would exceed the token budget (never cut). When fewer than k are
    found and the queue sends format examples, the places left go to the nearest tool calls
    of other tool sets (`Signature.admits_as_format`) that the queue shares with this token
    (`_format_sources`), after the rest and within the same budget, marked `format_only`.
    Neighbours: the `pool`
    nearest pinned or active examples at or above the minimum by the same ranking,
    duplicates kept, for offering their answers as candidates or as the answer. Below the
    minimum: the active examples that would have taken one of the k places without it.
    """
    minimum = queue.min_similarity
    if k <= 0 and pool <= 0:
        return Recall(examples=[], neighbours=[], minimum=minimum)
    if not (_preferred(queue).exists() if preferred is None else preferred):
        # Nothing to find: a new queue's requests are not embedded for nothing.
        return Recall(examples=[], neighbours=[], minimum=minimum)
    collection = index.collection_of(queue.pk)
    vector = vector or embeddings.embed_text(query_text)
    pinned, pinned_scores = _pinned_nearest_first(
        queue=queue, collection=collection, vector=vector, signature=signature, k=k, pool=pool
    )
    live, rejected, nearby = _live_hits(
        queue_id=queue.pk,
        collection=collection,
        vector=vector,
        limit=max(k * _OVERFETCH, pool),
        needed=max(k, pool),
        minimum=minimum,
        signature=signature,
    )
    live.sort(key=lambda pair: -pair[0].score * pair[1].weight)
    ranked, below, kept_vectors = _top_k(
        pinned=pinned[:k], pinned_scores=pinned_scores, live=live, k=k, minimum=minimum
    )
    format_ranked = _format_places(
        nearby,
        queue=queue,
        signature=signature,
        collection=collection,
        token_id=token_id,
        places=k - len(ranked),
        kept_vectors=kept_vectors,
    )
    return Recall(
        examples=_within_budget(ranked, token_budget, formats=format_ranked),
        neighbours=_neighbours(
            pinned=pinned, pinned_scores=pinned_scores, live=live, pool=pool, minimum=minimum
        ),
        below_minimum=_numbered(below),
        minimum=minimum,
        rejected=_numbered([(hit.score, e) for hit, e in rejected if hit.score >= minimum][:pool]),
    )


def _pinned_nearest_first(
    *,
    queue: Queue,
    collection: str,
    vector: list[float],
    signature: Signature,
    k: int,
    pool: int,
) -> tuple[list[Example], dict[uuid.UUID, float]]:
    """The queue's pinned examples this request admits (the oldest `max(k, pool)`), nearest
    first, and their similarities to it."""
    pinned = [
        example
        for example in _rows()
        .filter(queue=queue, role=Example.Role.PREFERRED, status=Example.Status.PINNED)
        .order_by("created_at")
        if _admitted(example, signature)
    ][: max(k, pool)]
    scores = vectors.search_among(collection=collection, vector=vector, ids=[e.pk for e in pinned])
    pinned.sort(key=lambda e: -scores.get(e.pk, 0.0))
    return pinned, scores


def _top_k(
    *,
    pinned: list[Example],
    pinned_scores: dict[uuid.UUID, float],
    live: _Hits,
    k: int,
    minimum: float,
) -> tuple[list[tuple[float, Example]], list[tuple[float, Example]], list[vectors.UnitVector]]:
    """The prompt's examples: the pinned ones, then the best-ranked live ones at or above the
    minimum, no near-duplicates, up to k; the ones the minimum left out where they would have
    stood; and the vectors kept, which format examples must not duplicate either."""
    ranked: list[tuple[float, Example]] = [(pinned_scores.get(e.pk, 0.0), e) for e in pinned]
    below: list[tuple[float, Example]] = []
    kept_vectors: list[vectors.UnitVector] = []
    below_vectors: list[vectors.UnitVector] = []
    for hit, example in live:
        if len(ranked) >= k:
            break
        unit = vectors.unit_array(hit.vector)
        if hit.score < minimum:
            # Recorded only where it would have stood without the minimum: within the top k,
            # and not a near-duplicate of one already there.
            if len(ranked) + len(below) < k and not _near_any(unit, kept_vectors + below_vectors):
                below_vectors.append(unit)
                below.append((hit.score, example))
            continue
        if _near_any(unit, kept_vectors):
            continue
        kept_vectors.append(unit)
        ranked.append((hit.score, example))
    return ranked, below, kept_vectors


def _format_places(
    nearby: list[vectors.Hit],
    *,
    queue: Queue,
    signature: Signature,
    collection: str,
    token_id: int | None,
    places: int,
    kept_vectors: list[vectors.UnitVector],
) -> list[tuple[float, Example]]:
    """The places the prompt's examples left, filled with format examples when the queue
    sends them and the request offers tools. They are about the form of a call, not the
    request's subject, and only that form reaches the prompt: the minimum similarity, which
    keeps off-topic requests away from memory's answers, does not apply (the queue's setting
    says so)."""
    if queue.format_examples_from == Queue.FormatExamples.OFF or not signature.tool_names:
        return []
    if places <= 0:
        return []
    formats = _formats_of(
        nearby,
        limit=places * _OVERFETCH,
        queue=queue,
        signature=signature,
        collection=collection,
        token_id=token_id,
    )
    chosen: list[tuple[float, Example]] = []
    for hit, example in formats:
        if len(chosen) >= places:
            break
        unit = vectors.unit_array(hit.vector)
        if _near_any(unit, kept_vectors):
            continue
        kept_vectors.append(unit)
        chosen.append((hit.score, example))
    return chosen


def _neighbours(
    *,
    pinned: list[Example],
    pinned_scores: dict[uuid.UUID, float],
    live: _Hits,
    pool: int,
    minimum: float,
) -> list[RetrievedExample]:
    """The `pool` nearest pinned or live examples at or above the minimum, by similarity ×
    weight. A stored answer is never offered, nor served, for a request it is not similar
    enough to: pinned or not (pinning puts an example in the prompt, not its answer in the
    reply)."""
    nearest = [
        (pinned_scores[e.pk], e.weight, e)
        for e in pinned
        if e.pk in pinned_scores and pinned_scores[e.pk] >= minimum
    ]
    nearest += [
        (hit.score, example.weight, example) for hit, example in live if hit.score >= minimum
    ]
    nearest.sort(key=lambda triple: -triple[0] * triple[1])
    return _numbered([(score, example) for score, _weight, example in nearest[:pool]])


def _numbered(scored: list[tuple[float, Example]]) -> list[RetrievedExample]:
    return [
        RetrievedExample(example=example, score=score, rank=rank)
        for rank, (score, example) in enumerate(scored, start=1)
    ]


def _near_any(unit: vectors.UnitVector, others: list[vectors.UnitVector]) -> bool:
    return any(float(unit @ other) > index.NEAR_DUPLICATE_COSINE for other in others)


def _admitted(example: Example, signature: Signature) -> bool:
    return signature.admits(tool_names=example.tool_names, output_format=example.output_format)


def _as_format(example: Example, signature: Signature) -> bool:
    """A format example shows a call: a step made under tools that answered in words would
    teach, under the format note, the prose the option is there to stop."""
    action = step_action(example.turns) or {}
    return bool(action.get("tool_calls")) and signature.admits_as_format(
        tool_names=example.tool_names, output_format=example.output_format
    )


def _live_hits(
    *,
    queue_id: int,
    collection: str,
    vector: list[float],
    limit: int,
    needed: int,
    minimum: float,
    signature: Signature,
) -> tuple[_Hits, _Hits, list[vectors.Hit]]:
    """Up to `limit` nearest active preferred examples, with their rows, those below the
    minimum similarity included (the caller keeps them out of use and records them); the
    active rejected examples among the same hits, nearest first; and the first search's
    hits, whatever they are (where format examples are looked for).

    First without a filter: a collection also holds rejected and retired examples, and the
    embedded store checks a filter point by point (at 10k points ~40× slower than a plain
    search). Rejected ones share their preferred sibling's request, so the nearest few
    dozen hold enough live ones; when they hold fewer than `needed` (the prompt's k, the
    memory candidates' pool) at or above the minimum, and every hit was above it (more may
    lie beyond), the exact filtered search follows. Neither search passes the minimum to
    the store: what falls below it is found, to be shown."""
    plain = vectors.search(
        collection=collection,
        vector=vector,
        limit=limit * _CROWDING,
        match={},
        with_vectors=False,  # building every hit's vector costs more than the search
        payload_fields=("queue_id", "role", "status"),
    )
    live, rejected = _live_of(plain, limit=limit, queue_id=queue_id, signature=signature)
    above = sum(hit.score >= minimum for hit, _ in live)
    if (
        above < needed
        and len(plain) == limit * _CROWDING
        and all(hit.score >= minimum for hit in plain)
    ):
        live, _ = _live_of(
            vectors.search(
                collection=collection,
                vector=vector,
                limit=limit,
                match={
                    "queue_id": [queue_id],
                    "role": [Example.Role.PREFERRED],
                    "status": [Example.Status.ACTIVE],
                },
            ),
            limit=limit,
            queue_id=queue_id,
            signature=signature,
        )
    return _with_vectors(live, collection=collection), rejected, plain


def _with_vectors(hits: _Hits, *, collection: str) -> _Hits:
    stored = vectors.vectors_of(collection=collection, ids=[hit.id for hit, _ in hits])
    return [(replace(hit, vector=stored[hit.id]), e) for hit, e in hits if hit.id in stored]


def _formats_of(
    hits: list[vectors.Hit],
    *,
    limit: int,
    queue: Queue,
    signature: Signature,
    collection: str,
    token_id: int | None,
) -> _Hits:
    """The first `limit` hits whose rows are the queue's active or pinned preferred examples
    that the signature admits as format examples only, from calls the queue shares with this
    token (`_format_sources`), nearest first, with their vectors. From the first, unfiltered
    search alone: any tool call shows the form, and the nearest few dozen points of a queue
    that stores tool steps hold enough of them."""
    queue_id = queue.pk
    retrieved = (Example.Status.ACTIVE, Example.Status.PINNED)
    candidates = [
        hit
        for hit in hits
        if hit.payload.get("queue_id") == queue_id
        and hit.payload.get("role") == Example.Role.PREFERRED
        and hit.payload.get("status") in retrieved
    ]
    rows = _rows().in_bulk([hit.id for hit in candidates])
    found = [
        (hit, rows[hit.id])
        for hit in candidates
        if hit.id in rows
        and rows[hit.id].queue_id == queue_id
        and rows[hit.id].role == Example.Role.PREFERRED
        and rows[hit.id].status in retrieved
        and _as_format(rows[hit.id], signature)
    ]
    shared = _format_sources(queue=queue, token_id=token_id, examples=[e for _, e in found])
    return _with_vectors(
        [(hit, e) for hit, e in found if e.pk in shared][:limit], collection=collection
    )


def _format_sources(
    *, queue: Queue, token_id: int | None, examples: list[Example]
) -> set[uuid.UUID]:
    """Which of `examples` the queue lets a call of this token see as format examples (its
    `format_examples_from`): none when off; every one when shared by every token; else those
    learnt from this token's own calls: steps of its runs, and reviewed calls it made. A call
    with no token (a review item typed or imported) has no calls of its own."""
    source = queue.format_examples_from
    if source == Queue.FormatExamples.QUEUE:
        return {e.pk for e in examples}
    if source != Queue.FormatExamples.TOKEN or token_id is None or not examples:
        return set()
    # By relation names, not imports: memory sits below the apps that own runs and calls.
    return set(
        Example.objects.filter(pk__in=[e.pk for e in examples])
        .filter(
            Q(step__trajectory__token_id=token_id) | Q(decision__item__calls__token_id=token_id)
        )
        .values_list("pk", flat=True)
    )


def _live_of(
    hits: list[vectors.Hit], *, limit: int, queue_id: int, signature: Signature
) -> tuple[list[tuple[vectors.Hit, Example]], list[tuple[vectors.Hit, Example]]]:
    """The first `limit` hits whose points and rows are the queue's active preferred
    examples that the signature admits, and the first `limit` that are its active rejected
    ones: the database is the source of truth, so a point whose row is gone or changed is
    stale, and a point or row of another queue (a store shared wrongly, a collection left
    from another install) is never anyone's example here.

    Rows are read for as many hits as are still missing, nearest first, rather than for all
    of them: a search over-fetches several times what is kept (see `_live_hits`), and
    reading rows is most of a retrieval's time. Both roles' rows are read in one query."""
    candidates = [
        hit
        for hit in hits
        if hit.payload.get("queue_id") == queue_id
        and hit.payload.get("status") == Example.Status.ACTIVE
    ]
    roles = (Example.Role.PREFERRED, Example.Role.REJECTED)
    waiting = {
        role: [hit for hit in candidates if hit.payload.get("role") == role] for role in roles
    }
    found: dict[str, list[tuple[vectors.Hit, Example]]] = {role: [] for role in roles}
    while any(waiting[role] and len(found[role]) < limit for role in roles):
        batch: dict[str, list[vectors.Hit]] = {}
        for role in roles:
            missing = limit - len(found[role])
            batch[role], waiting[role] = waiting[role][:missing], waiting[role][missing:]
        # By primary key alone: with `queue_id` in the WHERE too, SQLite's planner (no
        # statistics) walked the queue's index, every row of a 10k queue for each read.
        rows = _rows().in_bulk([hit.id for hits in batch.values() for hit in hits])
        for role in roles:
            found[role] += [
                (hit, rows[hit.id])
                for hit in batch[role]
                if hit.id in rows
                and rows[hit.id].queue_id == queue_id
                and rows[hit.id].role == role
                and rows[hit.id].status == Example.Status.ACTIVE
                and _admitted(rows[hit.id], signature)
            ]
    return found[Example.Role.PREFERRED], found[Example.Role.REJECTED]


def _rows() -> QuerySet[Example]:
    """Examples as retrieval reads them: without their neighbour lists, which only the admin
    shows and which grow with the queue."""
    return Example.objects.defer("similar")


def kept_answers(*, decision_ids: set[int]) -> dict[int, str]:
    """The preferred answer each of these decisions stored, by decision id."""
    if not decision_ids:
        return {}
    return dict(
        Example.objects.filter(
            decision_id__in=decision_ids, role=Example.Role.PREFERRED
        ).values_list("decision_id", "output_text")
    )


def examples_recall_anywhere(
    *,
    queue: Queue,
    query_text: str,
    k: int,
    token_budget: int,
    pool: int = 0,
    signature: Signature = PLAIN,
    token_id: int | None = None,
) -> Recall:
    """`examples_recall` from any process. A Qdrant server admits every process; the embedded
    store admits one, the worker that consumes the memory queue, so other processes ask it
    over its socket (`remote_recall`), which answers with the rows. No answer in
    GATEWAY_RECALL_TIMEOUT_S counts as the store being unavailable."""
    if settings.QDRANT_URL:
        return examples_recall(
            queue=queue,
            query_text=query_text,
            k=k,
            token_budget=token_budget,
            pool=pool,
            signature=signature,
            token_id=token_id,
        )
    if k <= 0 and pool <= 0:
        return Recall(examples=[], neighbours=[], minimum=queue.min_similarity)
    found = remote_recall.ask(
        {
            "queue_id": queue.pk,
            "queue": remote_recall.row_sent(queue),
            "query_text": query_text,
            "k": k,
            "token_budget": token_budget,
            "pool": pool,
            "signature": signature.as_json(),
            "token_id": token_id,
        },
        timeout_s=settings.GATEWAY_RECALL_TIMEOUT_S,
    )
    return _recall_of_answer(found, queue=queue, signature=signature, token_id=token_id)


# What each list of an owner's answer holds: the role its examples have.
_ANSWER_ROLES = {
    "examples": Example.Role.PREFERRED,
    "neighbours": Example.Role.PREFERRED,
    "below_minimum": Example.Role.PREFERRED,
    "rejected": Example.Role.REJECTED,
}


def _recall_of_answer(
    found: dict[str, Any], *, queue: Queue, signature: Signature, token_id: int | None
) -> Recall:
    """The recall an owner's answer names, with the rows it sent. Only rows the search
    could have found for this request are kept (the queue's own, active or pinned, of the
    role their list holds, admitted by the signature, or, among the prompt's examples of a
    queue that shares format examples with this token, admitted as one, and marked so): an
    answer is what
    arrived on a socket, and one that names an example of another queue, or a retired one,
    must not put it in this queue's prompt or reply. Raises VectorStoreUnavailable for an
    answer that cannot be read."""
    try:
        named = {
            name: [(uuid.UUID(pk), float(score)) for pk, score in found[name]]
            for name in _ANSWER_ROLES
        }
        minimum = None if found["minimum"] is None else float(found["minimum"])
        sent = [remote_recall.row_received(Example, row) for row in found["rows"]]
    except (KeyError, TypeError, ValueError) as error:
        raise VectorStoreUnavailable(
            "The worker that owns the store sent an unreadable answer."
        ) from error
    rows = {
        example.pk: example
        for example in sent
        if example.queue_id == queue.pk
        and example.status in (Example.Status.ACTIVE, Example.Status.PINNED)
    }
    shared = _format_sources(
        queue=queue,
        token_id=token_id,
        examples=[
            row
            for pk, _ in named["examples"]
            if (row := rows.get(pk)) is not None and _as_format(row, signature)
        ],
    )

    def retrieved(name: str) -> list[RetrievedExample]:
        found: list[RetrievedExample] = []
        for rank, (pk, score) in enumerate(named[name], start=1):
            row = rows.get(pk)
            if row is None or row.role != _ANSWER_ROLES[name]:
                continue
            if _admitted(row, signature):
                found.append(RetrievedExample(example=row, score=score, rank=rank))
            elif name == "examples" and row.pk in shared and _as_format(row, signature):
                found.append(
                    RetrievedExample(example=row, score=score, rank=rank, format_only=True)
                )
        return found

    return Recall(
        examples=retrieved("examples"),
        neighbours=retrieved("neighbours"),
        below_minimum=retrieved("below_minimum"),
        minimum=minimum,
        rejected=retrieved("rejected"),
    )


def recall_as_json(recall: Recall) -> dict[str, Any]:
    """A recall as the store's owner sends it: example ids and scores, and each example's row
    once (the asker, waiting for its answer, would otherwise read them again)."""

    def pairs(found: list[RetrievedExample]) -> list[list[Any]]:
        return [[str(r.example.pk), r.score] for r in found]

    found = recall.examples + recall.neighbours + recall.below_minimum + recall.rejected
    return {
        "examples": pairs(recall.examples),
        "neighbours": pairs(recall.neighbours),
        "below_minimum": pairs(recall.below_minimum),
        "minimum": recall.minimum,
        "rejected": pairs(recall.rejected),
        "rows": [
            remote_recall.row_sent(example)
            for example in {r.example.pk: r.example for r in found}.values()
        ],
    }


def _within_budget(
    ranked: list[tuple[float, Example]],
    token_budget: int,
    formats: list[tuple[float, Example]] | None = None,
) -> list[RetrievedExample]:
    """The ranked examples, then the format examples, added whole until the next one would
    exceed the budget."""
    chosen: list[RetrievedExample] = []
    used_tokens = 0
    queued = [(score, e, False) for score, e in ranked]
    queued += [(score, e, True) for score, e in formats or []]
    for score, example, format_only in queued:
        tokens = llm.count_tokens(example.input_text) + llm.count_tokens(
            json.dumps(example.turns) if example.turns else example.output_text
        )
        if used_tokens + tokens > token_budget:
            break
        used_tokens += tokens
        chosen.append(
            RetrievedExample(
                example=example, score=score, rank=len(chosen) + 1, format_only=format_only
            )
        )
    return chosen


def _preferred(queue: Queue) -> QuerySet[Example]:
    """The queue's preferred examples that are retrieved (active or pinned)."""
    return Example.objects.filter(
        queue=queue,
        role=Example.Role.PREFERRED,
        status__in=[Example.Status.ACTIVE, Example.Status.PINNED],
    )


def preferred_count(*, queue: Queue) -> int:
    """How many preferred examples the queue's memory holds for retrieval."""
    return _preferred(queue).count()


# Rejected answers shown beside each retrieved example when the queue sends rewards: enough
# to show what scored low, few enough to leave the budget to the examples themselves.
MAX_RIVALS = 2


def examples_rivals(*, examples: list[Example]) -> dict[uuid.UUID, list[Example]]:
    """Each example's rivals: the other answers its decision stored for the same request (the
    rejected ones, still active), lowest reward first, each text once and none equal to the
    example's own. A step an application corrected has the action it was served as its rival
    (the same feedback stored both); one learnt from a reward alone has none."""
    by_decision: dict[int | None, Example] = {
        e.decision_id: e for e in examples if e.decision_id is not None
    }
    by_feedback: dict[uuid.UUID | None, Example] = {
        e.feedback_id: e for e in examples if e.feedback_id is not None
    }
    rivals: dict[uuid.UUID, list[Example]] = {e.pk: [] for e in examples}
    rejected = Example.objects.filter(
        Q(decision_id__in=list(by_decision)) | Q(feedback_id__in=list(by_feedback)),
        role=Example.Role.REJECTED,
        status=Example.Status.ACTIVE,
    ).order_by("reward", "created_at", "candidate_id")
    for rival in rejected:
        example = by_decision.get(rival.decision_id) or by_feedback[rival.feedback_id]
        texts = {example.output_text.strip(), *(r.output_text.strip() for r in rivals[example.pk])}
        if len(rivals[example.pk]) < MAX_RIVALS and rival.output_text.strip() not in texts:
            rivals[example.pk].append(rival)
    return rivals
