"""Fitting a queue's calibration on its own decided items: what the ranking knew of each
candidate when it was generated, and whether the reviewer then accepted it as it was."""

import logging
from dataclasses import asdict, dataclass
from typing import Any

from icrlhf.generation import calibration as fitting
from icrlhf.generation.models import Calibration, Candidate
from icrlhf.generation.ranking import (
    FEATURES,
    MEMORY_FEATURES,
    PRIOR_COEFFICIENTS,
    calibration_latest,
    score,
)
from icrlhf.kinds import kind_of
from icrlhf.kinds.labels import answer_key
from icrlhf.queues.models import Queue
from icrlhf.queues.rules import Evidence, evidence_of
from icrlhf.review import guard
from icrlhf.review.models import Automation, AutomationPause, Decision, decided_items

logger = logging.getLogger(__name__)

# Below this many decided items a fitted confidence would mostly be noise.
MIN_ITEMS = 30
# …and with at least this many whose first candidate was accepted, and as many whose was not.
MIN_EACH_OUTCOME = 5
# A calibration is refitted once this many more items have been decided.
REFIT_EVERY = 10
FOLDS = 5
CURVE_THRESHOLDS = (0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 0.98, 0.99)
# The precisions the routing page recommends a threshold for, and the fewest items that must
# stand at or above a recommended threshold (the bound needs more near 100%: 59 all right
# for 95%).
TARGET_PRECISIONS = (0.9, 0.95, 0.98, 0.99)
MIN_ITEMS_ABOVE = 30
# From this many scored items on, the confidence may be an isotonic map instead of Platt's
# curve, if it measures better forward (Brier score): below, its steps would be noise.
ISOTONIC_MIN_ITEMS = 200


@dataclass(frozen=True)
class Sample:
    """One decided item: its candidates' features, and which of them were accepted."""

    item_id: int
    features: list[list[float]]
    accepted: list[bool]
    # How many items it stands for in the fits: an audit of an automated item stands for
    # the 1 / audit share automated items like it that no reviewer saw.
    weight: float = 1.0


def samples_of(queue: Queue) -> list[Sample]:
    """Each decided item once, by its first standing reviewer decision, on the generation it
    decided; a candidate counts as accepted when it is what the reviewer kept (the same
    answer, whichever candidate they clicked)."""
    kind = kind_of(queue)
    first_decisions = {
        decision.item_id: decision
        for decision in Decision.objects.filter(item__queue=queue)
        .first_standing_per_item()
        .only("item_id", "generation_id", "verdict", "final_text")
    }
    candidates: dict[int, list[Candidate]] = {}
    for candidate in Candidate.objects.filter(
        generation_id__in=[d.generation_id for d in first_decisions.values()],
        status=Candidate.Status.DONE,
        ranking_features__isnull=False,
    ).order_by("position"):
        candidates.setdefault(candidate.generation_id, []).append(candidate)
    # While automation runs, the confident region reaches reviewers only through audits:
    # weighted by the inverse of the audit share, so it is not learnt from a tenth of itself.
    audited = set(
        Automation.objects.filter(
            item__queue=queue, audit=True, item_id__in=first_decisions
        ).values_list("item_id", flat=True)
    )
    audit_weight = 100 / queue.audit_percent if queue.audit_percent else 1.0
    samples = []
    for decision in first_decisions.values():
        ranked = candidates.get(decision.generation_id)
        if not ranked:
            continue
        kept = (
            answer_key(decision.final_text)
            if decision.verdict != Decision.Verdict.NONE_ACCEPTABLE
            else None
        )
        samples.append(
            Sample(
                item_id=decision.item_id,
                features=[
                    [(c.ranking_features or {}).get(f, 0.0) for f in FEATURES] for c in ranked
                ],
                accepted=[
                    answer_key(kind.example_text(text=c.text, fields=c.fields)) == kept
                    for c in ranked
                ],
                weight=audit_weight if decision.item_id in audited else 1.0,
            )
        )
    return samples


def _fit(samples: list[Sample], names: tuple[str, ...] = FEATURES) -> list[float]:
    columns = [FEATURES.index(name) for name in names]
    rows = [[row[c] for c in columns] for s in samples for row in s.features]
    accepted = [hit for s in samples for hit in s.accepted]
    weights = [s.weight for s in samples for _ in s.features]
    return fitting.logistic_fit(rows, accepted, weights)


def _top(
    sample: Sample, coefficients: list[float], names: tuple[str, ...] = FEATURES
) -> tuple[float, bool]:
    """The score of the candidate ranked first, and whether it was accepted."""
    return max(
        (
            (score(dict(zip(FEATURES, row, strict=True)), coefficients, names), hit)
            for row, hit in zip(sample.features, sample.accepted, strict=True)
        ),
        key=lambda pair: pair[0],
    )


def forward_blocks(count: int) -> list[tuple[int, int]]:
    """Forward chaining: `count` items in the order they were decided, cut into FOLDS + 1
    blocks; each block after the first, (start, end), is predicted by a fit on every item
    before `start`, as production predicts new items from the decisions made so far.
    Interleaved folds would let later decisions (a larger memory) into the fit."""
    edges = [round(count * index / (FOLDS + 1)) for index in range(FOLDS + 2)]
    return [(edges[index], edges[index + 1]) for index in range(1, FOLDS + 1)]


def out_of_fold(
    samples: list[Sample], names: tuple[str, ...] = FEATURES
) -> list[tuple[float, bool]]:
    """The top score of each item after the first block, from a ranking fitted on the items
    decided before its block: how the ranking will do on items it has not seen."""
    tops = []
    for start, end in forward_blocks(len(samples)):
        coefficients = _fit(samples[:start], names)
        tops += [_top(sample, coefficients, names) for sample in samples[start:end]]
    return tops


def _confidence_map(
    tops: list[tuple[float, bool]], weights: list[float], *, isotonic: bool
) -> fitting.ConfidenceMap:
    """The confidence's fit on these tops: Platt's curve, and with `isotonic` and enough
    items, an isotonic map (Platt's curve kept beside it)."""
    scores, hits = [value for value, _ in tops], [hit for _, hit in tops]
    platt = fitting.platt_fit(scores, hits, weights)
    if isotonic and len(tops) >= ISOTONIC_MIN_ITEMS:
        return fitting.ConfidenceMap(platt, fitting.isotonic_fit(scores, hits, weights))
    return fitting.ConfidenceMap(platt)


@dataclass(frozen=True)
class Scored:
    confidence: float
    hit: bool
    isotonic: bool  # scored by an isotonic map (its fit had seen enough items)


def _confidences_forward(
    tops: list[tuple[float, bool]], weights: list[float], *, isotonic: bool
) -> list[Scored]:
    """Each top's confidence from a confidence fit on the tops before its block (forward
    again), with whether it was accepted: what the ECE and the curve are computed on, so that
    they say how the confidence does on items decided later. The first block has none."""
    scored = []
    for start, end in forward_blocks(len(tops)):
        mapped = _confidence_map(tops[:start], weights[:start], isotonic=isotonic)
        scored += [
            Scored(mapped(value), hit, mapped.isotonic is not None)
            for value, hit in tops[start:end]
        ]
    return scored


@dataclass(frozen=True)
class ConfidenceFit:
    """A confidence fitted on a ranking's forward tops, and how it did forward."""

    mapped: fitting.ConfidenceMap
    ece: float
    curve: list[dict[str, Any]]
    recommendations: list[dict[str, Any]]


def _confidence_fit(tops: list[tuple[float, bool]], weights: list[float]) -> ConfidenceFit:
    """Platt's curve while items are few. Once a forward block is fitted on at least
    ISOTONIC_MIN_ITEMS tops, an isotonic map is tried: kept if, on the blocks it scored, its
    confidences have a lower Brier score than Platt's on the same items. The ECE, the curve
    and the recommendations are those of the kind of map kept, on the items it scored: every
    later block for Platt's, only the isotonic blocks for the isotonic map (fewer items, so
    wider bounds, but the promise is measured on the map that makes it)."""
    judged = _confidences_forward(tops, weights, isotonic=False)
    bent = [s for s in _confidences_forward(tops, weights, isotonic=True) if s.isotonic]
    # The isotonic blocks are the last ones: compare on the same items.
    same = judged[len(judged) - len(bent) :]
    isotonic = bool(bent) and _brier(bent) < _brier(same)
    if isotonic:
        judged = bent
    confidences, hits = [s.confidence for s in judged], [s.hit for s in judged]
    return ConfidenceFit(
        mapped=_confidence_map(tops, weights, isotonic=isotonic),
        ece=fitting.expected_calibration_error(confidences, hits),
        curve=[
            asdict(point)
            for point in fitting.precision_coverage(confidences, hits, CURVE_THRESHOLDS)
        ],
        recommendations=[
            asdict(fitting.threshold_recommend(confidences, hits, target, MIN_ITEMS_ABOVE))
            for target in TARGET_PRECISIONS
        ],
    )


def _brier(scored: list[Scored]) -> float:
    return fitting.brier([s.confidence for s in scored], [s.hit for s in scored])


@dataclass(frozen=True)
class RankingFit:
    coefficients: list[float]
    confidence: ConfidenceFit
    accepted_share: float  # of the forward tops


def _ranking_fit(
    samples: list[Sample], names: tuple[str, ...], prior: tuple[float, ...] | None = None
) -> RankingFit | None:
    """A ranking fitted on every candidate of these samples, by these features, kept only if,
    forward, it puts an accepted answer first at least as often as the `prior` does (early
    decisions, made while memory was empty, teach a ranking little); then its confidence,
    fitted on the forward top scores (fitted on in-sample ones it would be overconfident).
    None unless enough of those tops were accepted and enough were not."""
    tops = out_of_fold(samples, names)
    predicted = samples[len(samples) - len(tops) :]
    coefficients = _fit(samples, names)
    if prior is not None:
        prior_tops = [_top(sample, list(prior), names) for sample in predicted]
        if sum(hit for _, hit in prior_tops) > sum(hit for _, hit in tops):
            tops, coefficients = prior_tops, list(prior)
    hits = [hit for _, hit in tops]
    if min(sum(hits), len(hits) - sum(hits)) < MIN_EACH_OUTCOME:
        return None
    return RankingFit(
        coefficients=coefficients,
        confidence=_confidence_fit(tops, [sample.weight for sample in predicted]),
        accepted_share=sum(hits) / len(hits),
    )


def _memory_only(samples: list[Sample]) -> dict[str, Any] | None:
    """The confidence of answering from memory alone, as the gateway does: each item's
    memory candidates only, scored by what memory says of them (no model answer to agree
    with, no answer to embed), fitted forward like the ranking. None while too few decided
    items had a memory candidate, or too few of them were accepted or turned down."""
    memory = FEATURES.index("memory")
    offered = [
        Sample(
            item_id=s.item_id,
            features=[row for row in s.features if row[memory]],
            accepted=[hit for row, hit in zip(s.features, s.accepted, strict=True) if row[memory]],
            weight=s.weight,
        )
        for s in samples
        if any(row[memory] for row in s.features)
    ]
    fit = _ranking_fit(offered, MEMORY_FEATURES) if len(offered) >= MIN_ITEMS else None
    if fit is None:
        return None
    return {
        "features": list(MEMORY_FEATURES),
        "coefficients": fit.coefficients,
        "platt": list(fit.confidence.mapped.platt),
        "isotonic": fit.confidence.mapped.isotonic,
        "items": len(offered),
        "accepted_share": fit.accepted_share,
        "ece": fit.confidence.ece,
        "curve": fit.confidence.curve,
        "recommendations": fit.confidence.recommendations,
    }


def calibration_fit(*, queue: Queue) -> Calibration | None:
    """Fit and store a new calibration, if the queue has enough decided items, with enough
    whose first candidate was accepted and enough whose was not (`_ranking_fit`, judged
    against the fixed prior), and beside it the memory-only one. Every feature was read off
    memory as it was when its item was generated (stored on the candidate then), so no item
    is scored with the memory its own decision made."""
    samples = samples_of(queue)
    fit = _ranking_fit(samples, FEATURES, PRIOR_COEFFICIENTS) if len(samples) >= MIN_ITEMS else None
    if fit is None:
        return None
    return Calibration.objects.create(
        queue=queue,
        features=list(FEATURES),
        coefficients=fit.coefficients,
        top_coefficients=list(fit.confidence.mapped.platt),
        isotonic=fit.confidence.mapped.isotonic,
        items=len(samples),
        candidates=sum(len(s.accepted) for s in samples),
        accepted_share=fit.accepted_share,
        ece=fit.confidence.ece,
        curve=fit.confidence.curve,
        recommendations=fit.confidence.recommendations,
        memory_fit=_memory_only(samples),
    )


def calibrations_refit() -> list[int]:
    """Periodic: refit each queue with REFIT_EVERY more decided, ranked items than its newest
    calibration was fitted on. Returns the ids of the queues refitted."""
    refitted = []
    for queue in Queue.objects.all():
        decided = decided_items(queue=queue)
        latest = calibration_latest(queue_id=queue.pk)
        if decided < MIN_ITEMS or (latest and decided - latest.items < REFIT_EVERY):
            continue
        if calibration_fit(queue=queue) is not None:
            refitted.append(queue.pk)
            logger.info("Calibration of queue %s refitted on %d items", queue.slug, decided)
    return refitted


@dataclass(frozen=True)
class RoutingFacts:
    """What a queue's routing rules rest on, each read once: its newest calibration, its
    active pause of automation, and the `Evidence` the rules' sentences are made from."""

    calibration: Calibration | None
    pause: AutomationPause | None
    evidence: Evidence


def routing_facts(queue: Queue) -> RoutingFacts:
    """Read where each fact lives, for the queue page and the routing page."""
    calibration = calibration_latest(queue_id=queue.pk)
    pause = guard.pause_active(queue)
    evidence = evidence_of(
        calibration=calibration,
        paused=pause is not None,
        needed=MIN_ITEMS,
        decided=decided_items(queue=queue),
        decided_from_memory=decided_items(queue=queue, from_memory=True),
    )
    return RoutingFacts(calibration=calibration, pause=pause, evidence=evidence)
