"""Ranking a generation's candidates by how likely reviewers are to accept each as it is.

Each finished candidate is described by a few numbers read off the memory, the request and
the other candidates (`features_of`). A queue's `Calibration`, fitted by the review app on
its own decided items, turns them into a score (a logistic model over candidates) and the
score into a confidence (a second logistic fit on how often the top-scored candidate was
accepted, out of fold, so the number means what it says). Until a queue has enough decided
items the candidates are ordered by a fixed prior and shown without a confidence: an
uncalibrated number would be read as a promise.

Runs in the memory worker, which embeds (the relevance of each answer to its request)."""

import hashlib
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from icrlhf.generation.models import Calibration, Candidate, Generation
from icrlhf.integrations import embeddings, vectors
from icrlhf.kinds import kind_of
from icrlhf.queues.models import Item

logger = logging.getLogger(__name__)

FEATURES = ("vote", "support", "nearest", "relevance", "agree", "memory", "knowledge")
# Votes are similarity to this power: a near-identical request counts far more than a loosely
# related one (on Banking77 the best of 1, 2, 4 and 8 with the others).
VOTE_POWER = 4
# The order before a queue is calibrated: memory's weighted vote, then how close the nearest
# request that had this answer is, then the answer's relevance to the request.
PRIOR_COEFFICIENTS = (-5.0, 3.0, 3.0, 0.0, 3.0, 1.0, 0.0, 0.0)


@dataclass(frozen=True)
class Neighbour:
    """A stored preferred example near the request, as the ranking needs it."""

    score: float  # cosine similarity of its request to this one
    answer_key: str


def answer_key(text: str) -> str:
    """Two answers count as the same when they differ only in case and whitespace."""
    return hashlib.sha256(" ".join(text.casefold().split()).encode()).hexdigest()[:20]


def features_of(
    *,
    key: str,
    relevance: float,
    from_memory: bool,
    neighbours: Sequence[Neighbour],
    other_keys: Sequence[str],
    stored: int,
) -> dict[str, float]:
    """What is known about one candidate before a reviewer sees it:

    vote       share of the neighbours' similarity-weighted votes that went to this answer
    support    similarity of the nearest neighbour whose answer this is (0: none)
    nearest    similarity of the nearest neighbour at all: how well memory covers the request
    relevance  cosine similarity of the answer to the request
    agree      share of the other candidates that gave the same answer
    memory     1 for an answer offered from memory, 0 for the model's
    knowledge  log(1 + preferred examples the queue had): the same similarity means more in
               a fuller memory
    """
    weights = [max(n.score, 0.0) ** VOTE_POWER for n in neighbours]
    mine = [(w, n) for w, n in zip(weights, neighbours, strict=True) if n.answer_key == key]
    total = sum(weights)
    return {
        "vote": sum(w for w, _ in mine) / total if total else 0.0,
        "support": max((n.score for _, n in mine), default=0.0),
        "nearest": max((n.score for n in neighbours), default=0.0),
        "relevance": relevance,
        "agree": sum(k == key for k in other_keys) / len(other_keys) if other_keys else 0.0,
        "memory": 1.0 if from_memory else 0.0,
        "knowledge": math.log1p(stored),
    }


def _sigmoid(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-max(-40.0, min(40.0, z))))


def score(
    features: dict[str, float], coefficients: Sequence[float], names: Sequence[str] = FEATURES
) -> float:
    """The ranking's linear score (a log-odds before calibration); `names` are the features
    the coefficients were fitted for, in their order."""
    return coefficients[0] + sum(
        c * features.get(name, 0.0) for c, name in zip(coefficients[1:], names, strict=True)
    )


def confidence(top_score: float, top_coefficients: Sequence[float]) -> float:
    """The calibrated probability that a candidate with this score, ranked first, is accepted."""
    return _sigmoid(top_coefficients[0] + top_coefficients[1] * top_score)


def calibration_latest(*, queue_id: int) -> Calibration | None:
    return Calibration.objects.filter(queue_id=queue_id).order_by("-created_at", "-pk").first()


def _relevances(request: str, answers: list[str]) -> list[float]:
    """Each answer's cosine similarity to the request; zeros when nothing can embed (the
    ranking goes on with what memory and the other candidates say)."""
    try:
        request_vector, *answer_vectors = embeddings.embed_texts([request, *answers])
    except embeddings.EmbeddingModelMissing as error:
        logger.warning("Ranking without relevance: %s", error)
        return [0.0] * len(answers)
    return [vectors.cosine(request_vector, vector) for vector in answer_vectors]


def _drawn_blind(generation_id: int, blind_percent: int) -> bool:
    """Whether a generation is shown blind: a draw fixed by its id (a re-rank draws alike)."""
    digest = hashlib.sha256(f"blind:{generation_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % 100 < blind_percent


def generation_rank(*, generation_id: int) -> bool:
    """Score the finished candidates, store their features and the first one's confidence,
    and put them in that order (their positions, hence their numbers on the page), best
    first. Returns whether it ranked: a generation is ranked once (it is claimed first, so a
    task enqueued twice ranks it once).

    The order is left alone once a reviewer has decided on the generation: a decision names
    its candidate by number. Only the first candidate gets a confidence: the calibration is
    fitted on how often the first one was accepted."""
    generation = Generation.objects.select_related("item__queue").get(pk=generation_id)
    if generation.ranked_at is not None:
        return False
    queue = generation.item.queue
    kind = kind_of(queue)
    done = list(generation.candidates.filter(status=Candidate.Status.DONE).order_by("position"))
    answers = [kind.example_text(text=c.text, fields=c.fields) for c in done]
    keys = [answer_key(answer) for answer in answers]
    relevances = _relevances(generation.item.input_text, answers)
    neighbours = [Neighbour(n["score"], n["answer_key"]) for n in generation.neighbours]
    calibration = calibration_latest(queue_id=queue.pk)
    scored = []
    for index, candidate in enumerate(done):
        features = features_of(
            key=keys[index],
            relevance=relevances[index],
            from_memory=candidate.source == Candidate.Source.MEMORY,
            neighbours=neighbours,
            other_keys=keys[:index] + keys[index + 1 :],
            stored=generation.stored_examples,
        )
        value = (
            score(features, calibration.coefficients, calibration.features)
            if calibration
            else score(features, PRIOR_COEFFICIENTS)
        )
        scored.append((value, candidate, features))
    scored.sort(key=lambda triple: -triple[0])  # stable: ties keep their shuffled order
    with transaction.atomic():
        # The item's row lock is the one decisions take: none lands between the check and
        # the renumbering.
        Item.objects.select_for_update().filter(pk=generation.item_id).first()
        blind = generation.blind or _drawn_blind(generation_id, queue.blind_percent)
        claimed = Generation.objects.filter(pk=generation_id, ranked_at__isnull=True).update(
            ranked_at=timezone.now(), calibration=calibration, blind=blind
        )
        if not claimed:
            return False
        # A blind one keeps its shuffled order: its ranks are recorded, not shown.
        reorder = not blind and not generation.decisions.exists()
        Candidate.objects.filter(generation=generation).update(confidence=None)  # ranked anew
        if reorder:
            # Two steps, as positions are unique within a generation.
            offset = generation.n_candidates + 1
            Candidate.objects.filter(generation=generation).update(position=F("position") + offset)
        for position, (value, candidate, features) in enumerate(scored):
            first = position == 0
            Candidate.objects.filter(pk=candidate.pk).update(
                rank=position + 1,
                ranking_features=features,
                confidence=(
                    confidence(value, calibration.top_coefficients)
                    if calibration and first
                    else None
                ),
                **({"position": position} if reorder else {}),
            )
        if reorder:
            unfinished = generation.candidates.exclude(pk__in=[c.pk for c in done])
            for position, candidate in enumerate(unfinished.order_by("position"), len(done)):
                Candidate.objects.filter(pk=candidate.pk).update(position=position)
    return True
