"""Fitting a queue's calibration on its own decided items: what the ranking knew of each
candidate when it was generated, and whether the reviewer then accepted it as it was."""

import logging
from dataclasses import asdict, dataclass

from icrlhf.generation import calibration as fitting
from icrlhf.generation.models import Calibration, Candidate
from icrlhf.generation.ranking import (
    FEATURES,
    PRIOR_COEFFICIENTS,
    answer_key,
    calibration_latest,
    confidence,
    score,
)
from icrlhf.kinds import kind_of
from icrlhf.queues.models import Item, Queue
from icrlhf.review.models import Automation, Decision

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
    first_decisions: dict[int, Decision] = {}
    for decision in (
        Decision.objects.standing()
        .filter(item__queue=queue)
        .order_by("created_at", "pk")
        .only("item_id", "generation_id", "verdict", "final_text")
    ):
        first_decisions.setdefault(decision.item_id, decision)
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


def _fit(samples: list[Sample]) -> list[float]:
    rows = [row for s in samples for row in s.features]
    accepted = [hit for s in samples for hit in s.accepted]
    weights = [s.weight for s in samples for _ in s.features]
    return fitting.logistic_fit(rows, accepted, weights)


def _top(sample: Sample, coefficients: list[float]) -> tuple[float, bool]:
    """The score of the candidate ranked first, and whether it was accepted."""
    return max(
        (
            (score(dict(zip(FEATURES, row, strict=True)), coefficients), hit)
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


def out_of_fold(samples: list[Sample]) -> list[tuple[float, bool]]:
    """The top score of each item after the first block, from a ranking fitted on the items
    decided before its block: how the ranking will do on items it has not seen."""
    tops = []
    for start, end in forward_blocks(len(samples)):
        coefficients = _fit(samples[:start])
        tops += [_top(sample, coefficients) for sample in samples[start:end]]
    return tops


def _platt(tops: list[tuple[float, bool]], weights: list[float]) -> list[float]:
    """The confidence's fit: a logistic regression of acceptance on the top score (each
    weighted as its item), with one accepted and one rejected pseudo-item at the median score,
    so that a sample where every top was accepted (or none was) gives a confidence short of
    certainty."""
    median = sorted(value for value, _ in tops)[len(tops) // 2]
    rows = [[value] for value, _ in tops] + [[median], [median]]
    return fitting.logistic_fit(rows, [hit for _, hit in tops] + [True, False], [*weights, 1, 1])


def _confidences_forward(
    tops: list[tuple[float, bool]], weights: list[float]
) -> list[tuple[float, bool]]:
    """Each top's confidence from a confidence fit on the tops before its block (forward
    again), with whether it was accepted: what the ECE and the curve are computed on, so that
    they say how the confidence does on items decided later. The first block has none."""
    scored = []
    for start, end in forward_blocks(len(tops)):
        coefficients = _platt(tops[:start], weights[:start])
        scored += [(confidence(value, coefficients), hit) for value, hit in tops[start:end]]
    return scored


def calibration_fit(*, queue: Queue) -> Calibration | None:
    """Fit and store a new calibration, if the queue has enough decided items, with enough
    whose first candidate was accepted and enough whose was not.

    The ranking is fitted on every candidate, and kept only if, forward, it puts an
    accepted answer first more often than the prior does (early decisions, made while memory
    was empty, teach a ranking little). The confidence is then fitted on the chosen
    ranking's forward top scores: fitted on in-sample ones it would be overconfident."""
    samples = samples_of(queue)
    if len(samples) < MIN_ITEMS:
        return None
    tops = out_of_fold(samples)
    # The prior, judged on the same (later) items.
    predicted = samples[len(samples) - len(tops) :]
    prior_tops = [_top(sample, list(PRIOR_COEFFICIENTS)) for sample in predicted]
    coefficients = _fit(samples)
    if sum(hit for _, hit in prior_tops) > sum(hit for _, hit in tops):
        tops, coefficients = prior_tops, list(PRIOR_COEFFICIENTS)
    hits = [hit for _, hit in tops]
    if min(sum(hits), len(hits) - sum(hits)) < MIN_EACH_OUTCOME:
        return None
    weights = [sample.weight for sample in predicted]
    scored = _confidences_forward(tops, weights)
    confidences, later_hits = [c for c, _ in scored], [hit for _, hit in scored]
    return Calibration.objects.create(
        queue=queue,
        features=list(FEATURES),
        coefficients=coefficients,
        top_coefficients=_platt(tops, weights),
        items=len(samples),
        candidates=sum(len(s.accepted) for s in samples),
        accepted_share=sum(hits) / len(hits),
        ece=fitting.expected_calibration_error(confidences, later_hits),
        curve=[
            asdict(point)
            for point in fitting.precision_coverage(confidences, later_hits, CURVE_THRESHOLDS)
        ],
        recommendations=[
            asdict(fitting.threshold_recommend(confidences, later_hits, target, MIN_ITEMS_ABOVE))
            for target in TARGET_PRECISIONS
        ],
    )


def calibrations_refit() -> list[int]:
    """Periodic: refit each queue with REFIT_EVERY more decided, ranked items than its newest
    calibration was fitted on. Returns the ids of the queues refitted."""
    refitted = []
    for queue in Queue.objects.all():
        decided = (
            Item.objects.filter(
                queue=queue,
                decisions__superseded_at__isnull=True,
                decisions__generation__ranked_at__isnull=False,
            )
            .distinct()
            .count()
        )
        latest = calibration_latest(queue_id=queue.pk)
        if decided < MIN_ITEMS or (latest and decided - latest.items < REFIT_EVERY):
            continue
        if calibration_fit(queue=queue) is not None:
            refitted.append(queue.pk)
            logger.info("Calibration of queue %s refitted on %d items", queue.slug, decided)
    return refitted
