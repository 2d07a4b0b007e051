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
from typing import Any

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from icrlhf.generation.calibration import ConfidenceMap
from icrlhf.generation.models import Calibration, Candidate, Generation
from icrlhf.integrations import embeddings, vectors
from icrlhf.kinds import kind_of
from icrlhf.kinds.labels import answer_key
from icrlhf.memory import selectors as memory_selectors
from icrlhf.memory.selectors import Recall, RetrievedExample
from icrlhf.queues.locks import item_lock_if_present
from icrlhf.queues.models import Queue

logger = logging.getLogger(__name__)

FEATURES = ("vote", "support", "nearest", "relevance", "agree", "memory", "knowledge", "against")
# Memory candidates and the ranking's votes are drawn from this many nearest stored requests,
# not only from the k in the prompt: near neighbours often share one answer, and distinct
# answers are what is offered.
MEMORY_NEIGHBOURS = 20
# What the gateway knows of an answer from memory before it serves one: no model answer to
# agree with, none embedded.
MEMORY_FEATURES = ("vote", "support", "nearest", "knowledge", "against")
# Votes are similarity to this power: a near-identical request counts far more than a loosely
# related one (on Banking77 the best of 1, 2, 4 and 8 with the others).
VOTE_POWER = 4
# The order before a queue is calibrated: memory's weighted vote, then how close the nearest
# request that had this answer is, then the answer's relevance to the request.
PRIOR_COEFFICIENTS = (-5.0, 3.0, 3.0, 0.0, 3.0, 1.0, 0.0, 0.0, -3.0)


@dataclass(frozen=True)
class Neighbour:
    """A stored example near the request, as the ranking needs it."""

    score: float  # cosine similarity of its request to this one
    key: str  # what its answer votes for (the kind's vote key)
    rejected: bool = False  # a reviewer turned this answer down: a vote against it

    @classmethod
    def of_json(cls, stored: dict[str, Any]) -> "Neighbour":
        # Generations prepared before votes were keyed by the kind kept the answer's own key
        # (`legacy_keys` says so, and their candidates are keyed alike).
        return cls(
            stored["score"],
            stored.get("vote_key") or stored["answer_key"],
            stored.get("rejected", False),
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "score": self.score,
            "vote_key": self.key,
            **({"rejected": True} if self.rejected else {}),
        }


def legacy_keys(stored: Sequence[dict[str, Any]]) -> bool:
    """Whether a generation's neighbours were stored before votes were keyed by the kind."""
    return any("vote_key" not in n for n in stored)


def features_of(
    *,
    key: str,
    relevance: float,
    from_memory: bool,
    neighbours: Sequence[Neighbour],
    other_keys: Sequence[str],
    stored: int,
) -> dict[str, float]:
    """What is known about one candidate before a reviewer sees it. Answers are compared by
    the kind's vote key (an intent's label, a ticket's category and priority), so that
    answers worded apart but meaning the same pool their votes:

    vote       share of the preferred neighbours' similarity-weighted votes for this answer
    support    similarity of the nearest preferred neighbour whose answer this is (0: none)
    nearest    similarity of the nearest preferred neighbour: how well memory covers it
    relevance  cosine similarity of the answer to the request
    agree      share of the other candidates that gave the same answer
    memory     1 for an answer offered from memory, 0 for the model's
    knowledge  log(1 + preferred examples the queue had): the same similarity means more in
               a fuller memory
    against    share of all the neighbours' weighted votes (preferred and rejected) that are
               rejections of this answer: reviewers turned it down for similar requests
    """
    weights = [max(n.score, 0.0) ** VOTE_POWER for n in neighbours]
    weighted = list(zip(weights, neighbours, strict=True))
    preferred = [(w, n) for w, n in weighted if not n.rejected]
    mine = [(w, n) for w, n in preferred if n.key == key]
    preferred_total = sum(w for w, _ in preferred)
    total = sum(weights)
    return {
        "vote": sum(w for w, _ in mine) / preferred_total if preferred_total else 0.0,
        "support": max((n.score for _, n in mine), default=0.0),
        "nearest": max((n.score for _, n in preferred), default=0.0),
        "relevance": relevance,
        "agree": sum(k == key for k in other_keys) / len(other_keys) if other_keys else 0.0,
        "memory": 1.0 if from_memory else 0.0,
        "knowledge": math.log1p(stored),
        "against": sum(w for w, n in weighted if n.rejected and n.key == key) / total
        if total
        else 0.0,
    }


def neighbours_of(*, queue: Queue, recall: Recall) -> list[Neighbour]:
    """What the ranking keeps of a retrieval: each near preferred example's similarity and
    the vote key of its answer, then the rejected ones. A rejected answer that means what its
    own reviewer kept (another candidate naming the same label, the same words) is no vote
    against it: the decision stored every other candidate as rejected, alike or not."""
    kind = kind_of(queue)

    def key_of(text: str) -> str:
        return kind.vote_key(text=text, queue=queue)

    preferred = [Neighbour(hit.score, key_of(hit.example.output_text)) for hit in recall.neighbours]
    kept = {
        hit.example.decision_id: neighbour.key
        for hit, neighbour in zip(recall.neighbours, preferred, strict=True)
        if hit.example.decision_id is not None
    }
    missing = {
        hit.example.decision_id
        for hit in recall.rejected
        if hit.example.decision_id is not None and hit.example.decision_id not in kept
    }
    kept |= {
        decision_id: key_of(text)
        for decision_id, text in memory_selectors.kept_answers(decision_ids=missing).items()
    }
    against = []
    for hit in recall.rejected:
        key = key_of(hit.example.output_text)
        if hit.example.decision_id is None or kept.get(hit.example.decision_id) != key:
            against.append(Neighbour(hit.score, key, rejected=True))
    return preferred + against


def score(
    features: dict[str, float], coefficients: Sequence[float], names: Sequence[str] = FEATURES
) -> float:
    """The ranking's linear score (a log-odds before calibration); `names` are the features
    the coefficients were fitted for, in their order."""
    return coefficients[0] + sum(
        c * features.get(name, 0.0) for c, name in zip(coefficients[1:], names, strict=True)
    )


def confidence(top_score: float, calibration: Calibration) -> float:
    """The calibrated probability that a candidate with this score, ranked first, is accepted."""
    return ConfidenceMap(calibration.top_coefficients, calibration.isotonic)(top_score)


def memory_vote_best(
    *, keys: Sequence[str], neighbours: Sequence[Neighbour], stored: int, memory_fit: dict[str, Any]
) -> tuple[str, float] | None:
    """Of the answers memory could give (`keys`: vote keys), the one the memory-only fit
    scores highest, with its calibrated confidence; None with none to give."""
    best: tuple[float, str] | None = None
    for key in dict.fromkeys(keys):
        features = features_of(
            key=key,
            relevance=0.0,
            from_memory=True,
            neighbours=neighbours,
            other_keys=[],
            stored=stored,
        )
        value = score(features, memory_fit["coefficients"], memory_fit["features"])
        if best is None or value > best[0]:
            best = (value, key)
    if best is None:
        return None
    return best[1], ConfidenceMap(memory_fit["platt"], memory_fit["isotonic"])(best[0])


def memory_answer_best(
    *, queue: Queue, recall: Recall, offered: Sequence[RetrievedExample], memory_fit: dict[str, Any]
) -> tuple[RetrievedExample, float] | None:
    """Of the stored answers `offered` (in the recall's order), the one the memory-only fit
    scores highest, with its calibrated confidence: what the gateway serves above the queue's
    confidence. As a generation offers them: the first `memory_candidates` distinct answers,
    each by its first example, with the features a generation reads off its retrieval."""
    if not offered:
        return None
    neighbours = neighbours_of(queue=queue, recall=recall)
    # The offered hits are among the recall's neighbours, whose keys come first, in order.
    key_of = {
        hit.example.pk: neighbour.key
        for hit, neighbour in zip(recall.neighbours, neighbours, strict=False)
    }
    first_of: dict[str, RetrievedExample] = {}
    for hit in offered:
        if len(first_of) >= max(1, queue.memory_candidates):  # the nearest answer, at least
            break
        first_of.setdefault(key_of[hit.example.pk], hit)
    best = memory_vote_best(
        keys=list(first_of),
        neighbours=neighbours,
        stored=memory_selectors.preferred_count(queue=queue),
        memory_fit=memory_fit,
    )
    return None if best is None else (first_of[best[0]], best[1])


def memory_fit_latest(*, queue_id: int) -> dict[str, Any] | None:
    """The newest calibration's memory-only fit, read alone (the gateway's hot path)."""
    fits = Calibration.objects.filter(queue_id=queue_id).order_by("-created_at", "-pk")
    fit: dict[str, Any] | None = fits.values_list("memory_fit", flat=True).first()
    return fit


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
    legacy = legacy_keys(generation.neighbours)
    keys = [
        answer_key(answer) if legacy else kind.vote_key(text=answer, queue=queue)
        for answer in answers
    ]
    relevances = _relevances(generation.item.input_text, answers)
    neighbours = [Neighbour.of_json(n) for n in generation.neighbours]
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
        item_lock_if_present(generation.item_id)
        blind = generation.blind or _drawn_blind(generation_id, queue.blind_percent)
        claimed = Generation.objects.filter(pk=generation_id, ranked_at__isnull=True).update(
            ranked_at=timezone.now(), calibration=calibration, blind=blind
        )
        if not claimed:
            return False
        # A blind one keeps its shuffled order: its ranks are recorded, not shown. So does a
        # captured call's: ordered, its served answer would stand out (first, or alone first
        # when the others failed), and it is judged blind.
        served = generation.candidates.filter(served=True).exists()
        reorder = not blind and not served and not generation.decisions.exists()
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
                confidence=(confidence(value, calibration) if calibration and first else None),
                **({"position": position} if reorder else {}),
            )
        if reorder:
            unfinished = generation.candidates.exclude(pk__in=[c.pk for c in done])
            for position, candidate in enumerate(unfinished.order_by("position"), len(done)):
                Candidate.objects.filter(pk=candidate.pk).update(position=position)
    return True
