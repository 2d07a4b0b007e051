"""The inner loop of bench_learning: runs inside the throw-away world, with Django set up and
a real worker (retrieval, memory candidates, the configured LLM) consuming its queue."""

import json
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User

from bench.learning import (
    OFF_TOPIC,
    TARGET_PRECISION,
    Counts,
    Labelled,
    confidence_summary,
    ece_interval,
    label_of,
    labelled_split,
    minimum_choose,
    rating_of,
    significance,
    summarise,
)
from bench.playbook_arms import playbook_arms
from icrlhf.generation.calibration import expected_calibration_error, precision_coverage
from icrlhf.generation.models import Calibration, Candidate, Generation
from icrlhf.generation.prompts import PromptExample, messages_build
from icrlhf.generation.ranking import (
    MEMORY_NEIGHBOURS,
    Neighbour,
    calibration_latest,
    memory_vote_best,
)
from icrlhf.generation.services import item_create
from icrlhf.integrations import llm
from icrlhf.kinds import kind_of
from icrlhf.memory.models import Example
from icrlhf.memory.selectors import examples_recall_anywhere, examples_rivals
from icrlhf.ops.stack import wait_until
from icrlhf.queues.models import Item, Queue
from icrlhf.review.calibrations import calibration_fit
from icrlhf.review.claims import item_try_again
from icrlhf.review.decisions import decision_record

MAX_TOKENS = 12  # An intent label is a few tokens; more only adds chatter.
LEARNING_STEP = 50  # decisions between two refits of the calibration


@dataclass(frozen=True)
class Bench:
    labels: list[str]
    held_out: list[Labelled]
    stream: list[Labelled]
    reviewer: User
    queue: Queue  # the product as configured: retrieval and memory candidates
    plain: Queue  # the same model and prompt, nothing retrieved: the baseline
    temperature: float
    ratings: bool  # the simulated reviewer rates every candidate 1…5 as well as picking


def _bench_build(options: dict[str, Any], stream_size: int) -> Bench:
    data = Path(options["dataset"])
    labels: list[str] = json.loads((data / "categories.json").read_text())
    held_out, stream = labelled_split(
        data / "test.csv", seed=options["seed"], test=options["test"], stream=stream_size
    )
    common = {
        "system_prompt": (
            "Classify the bank customer's message as exactly one of these intents: "
            + ", ".join(labels)
            + ". Answer with the intent label only."
        ),
        "max_tokens": MAX_TOKENS,
        "example_token_budget": 4000,
        "blind_percent": 0,  # the first candidate is the ranking's: never shown shuffled
        "temperature": options["temperature"],
    }
    queue = Queue.objects.create(
        slug="learning",
        name="Learning",
        n_candidates=options["candidates"],
        k_examples=5,
        # The queue's minimum similarity is the one gate: every stored answer at or above it
        # may be offered.
        min_similarity=options["min_similarity"],
        memory_candidates=options["memory_candidates"],
        memory_min_similarity=-1.0,
        # An intent queue: memory's votes count the label an answer names (unless the run
        # compares them with votes on the verbatim answer).
        categories=[] if options["verbatim_votes"] else labels,
        example_framing=options["framing"],
        example_rewards=options["example_rewards"],
        **common,
    )
    plain = Queue.objects.create(
        slug="plain",
        name="No retrieval",
        n_candidates=1,
        k_examples=0,
        memory_candidates=0,
        **common,
    )
    return Bench(
        labels=labels,
        held_out=held_out,
        stream=stream,
        reviewer=User.objects.create_user("bench-reviewer"),
        queue=queue,
        plain=plain,
        temperature=options["temperature"],
        ratings=options["ratings"],
    )


def _generate(bench: Bench, queue: Queue, rows: list[Labelled], n: int | None = None) -> list[Item]:
    """Creates the items through the product's service and waits for the worker to settle them."""
    ids = [
        item_create(queue=queue, input_text=row.text, created_by=bench.reviewer, n_candidates=n).pk
        for row in rows
    ]
    wait_until(
        lambda: (
            not Item.objects.filter(pk__in=ids, status=Item.Status.GENERATING).exists()
            and not Generation.objects.filter(
                item_id__in=ids, status=Generation.Status.DONE, ranked_at__isnull=True
            ).exists()
        ),
        timeout_s=3600,
        what="generation and ranking",
    )
    return list(Item.objects.filter(pk__in=ids).order_by("pk"))


def _candidates(item: Item) -> list[Candidate]:
    """Done candidates in the order the system ranks them, as reviewers see them."""
    return list(item.generations.get().candidates.filter(status="done").order_by("position"))


def _learn(bench: Bench, rows: list[Labelled]) -> None:
    """The simulated reviewer: picks the candidate naming the gold intent, or edits one to it.
    Then the queue's calibration is refitted on every decision so far, as the worker's
    periodic refit would."""
    items = _generate(bench, bench.queue, rows)
    for item, row in zip(items, rows, strict=True):
        candidates = _candidates(item)
        if not candidates:
            continue
        right = next((c for c in candidates if label_of(c.text, bench.labels) == row.label), None)
        decision_record(
            item_id=item.pk,
            reviewer=bench.reviewer,
            verdict="chosen" if right else "edited",
            candidate_id=(right or candidates[0]).pk,
            final_text=row.label,
            ratings=_ratings(bench, candidates, row) if bench.ratings else None,
        )
    wait_until(
        lambda: not Example.objects.exclude(index_state=Example.IndexState.INDEXED).exists(),
        timeout_s=600,
        what="indexing",
    )
    calibration_fit(queue=bench.queue)


def _ratings(bench: Bench, candidates: list[Candidate], row: Labelled) -> dict[int, int]:
    return {c.pk: rating_of(label_of(c.text, bench.labels), row.label) for c in candidates}


@dataclass
class Evaluation:
    counts: Counts
    llm_calls_saved: float
    confidences: list[float]  # the first candidate's, where the queue was calibrated
    first_right: list[bool]
    # The best answer from memory alone, as the gateway would serve it: its memory-only
    # confidence, and whether it named the gold intent (where the queue had that fit).
    memory_confidences: list[float]
    memory_right: list[bool]
    missed: list[tuple[Item, Labelled]]  # no candidate named the gold intent


def _evaluate(bench: Bench, *, memory_size: int) -> Evaluation:
    """Scores the held-out messages, generated through the product: the rates, the share of
    candidates that came from memory (LLM calls saved), and the first candidate's
    confidence against whether it was right."""
    first = accepted = llm_right = llm_total = knn = gold_retrieved = 0
    from_memory = total_candidates = with_examples = in_prompt = related = 0
    confidences, first_right = [], []
    memory_confidences, memory_right = [], []
    missed = []
    items = _generate(bench, bench.queue, bench.held_out)
    calibration = calibration_latest(queue_id=bench.queue.pk)
    memory_fit = calibration.memory_fit if calibration else None
    kind = kind_of(bench.queue)
    for item, row in zip(items, bench.held_out, strict=True):
        candidates = _candidates(item)
        served = memory_fit and _memory_served(item, memory_fit, bench.queue.memory_candidates)
        if served:
            memory_confidences.append(served[1])
            memory_right.append(served[0] == kind.vote_key(text=row.label, queue=bench.queue))
        named = [label_of(c.text, bench.labels) for c in candidates]
        first += bool(named) and named[0] == row.label
        if candidates and candidates[0].confidence is not None:
            confidences.append(candidates[0].confidence)
            first_right.append(named[0] == row.label)
        accepted += row.label in named
        if candidates and row.label not in named:
            missed.append((item, row))
        model_named = [n for n, c in zip(named, candidates, strict=True) if c.source == "llm"]
        if model_named:
            llm_total += 1
            llm_right += model_named[0] == row.label
        from_memory += len(candidates) - len(model_named)
        total_candidates += len(candidates)
        retrieved = [
            label_of(r.example.output_text, bench.labels)
            for r in item.generations.get().retrievals.select_related("example").order_by("rank")
        ]
        knn += bool(retrieved) and retrieved[0] == row.label
        gold_retrieved += row.label in retrieved
        with_examples += bool(retrieved)
        in_prompt += len(retrieved)
        related += retrieved.count(row.label)  # examples of the message's own intent
    n = len(bench.held_out)
    measured_n = n if memory_size else 0
    counts = {
        "first_accuracy": (first, n),
        "acceptance": (accepted, n),
        "llm_with_examples": (llm_right, llm_total),
        "knn_top1": (knn, measured_n),
        "gold_retrieved": (gold_retrieved, measured_n),
        "with_examples": (with_examples, measured_n),
        "related_examples": (related, in_prompt),
    }
    return Evaluation(
        counts=counts,
        llm_calls_saved=from_memory / total_candidates if total_candidates else 0.0,
        confidences=confidences,
        first_right=first_right,
        memory_confidences=memory_confidences,
        memory_right=memory_right,
        missed=missed,
    )


def _memory_served(
    item: Item, memory_fit: dict[str, Any], offered: int
) -> tuple[str, float] | None:
    """What the gateway would answer from memory alone for this request, read off the
    neighbours its generation retrieved: of the first `offered` distinct answers, the
    best-scored vote key and its confidence."""
    generation = item.generations.get()
    neighbours = [Neighbour.of_json(n) for n in generation.neighbours]
    keys = list(dict.fromkeys(n.key for n in neighbours if not n.rejected))[:offered]
    return memory_vote_best(
        keys=keys,
        neighbours=neighbours,
        stored=generation.stored_examples,
        memory_fit=memory_fit,
    )


def _recovery(bench: Bench, missed: list[tuple[Item, Labelled]]) -> Counts:
    """The messages no candidate got right, tried again: the reviewer rates the round (as
    `_ratings`, or all 1 without ratings) and presses "try again", so the next round sees
    those answers and rewards with the explore-or-exploit instruction. The control is the
    same messages generated afresh with the same memory, as "regenerate" would: does a
    round that knows what scored low find the right answer more often?"""
    rows = [row for _, row in missed]
    for item, row in missed:
        candidates = _candidates(item)
        ratings = (
            _ratings(bench, candidates, row) if bench.ratings else {c.pk: 1 for c in candidates}
        )
        item_try_again(
            item_id=item.pk, reviewer=bench.reviewer, ratings=ratings, reasons=[], comment=""
        )
    ids = [item.pk for item, _ in missed]
    wait_until(
        lambda: not Item.objects.filter(pk__in=ids, status=Item.Status.GENERATING).exists(),
        timeout_s=3600,
        what="try-again rounds",
    )
    retried = [_latest_candidates(Item.objects.get(pk=pk)) for pk in ids]
    fresh = [_candidates(item) for item in _generate(bench, bench.queue, rows)]
    counts: Counts = {}
    for name, rounds in (("try_again", retried), ("regenerate", fresh)):
        recovered = llm_right = llm_total = 0
        for candidates, row in zip(rounds, rows, strict=True):
            named = [label_of(c.text, bench.labels) for c in candidates]
            recovered += row.label in named
            from_llm = [n for n, c in zip(named, candidates, strict=True) if c.source == "llm"]
            llm_right += from_llm.count(row.label)
            llm_total += len(from_llm)
        counts[f"{name}_recovered"] = (recovered, len(rows))
        counts[f"{name}_llm_right"] = (llm_right, llm_total)
    return counts


def _recommended(
    recommendations: list[dict[str, Any]],
    confidences: list[float],
    right: list[bool],
    prefix: str = "",
) -> dict[str, Any]:
    """The threshold the queue's routing page recommends for 95% precision (null when it
    recommends none) and the precision the held-out messages then get above it."""
    recommendation = next((r for r in recommendations if r["target"] == TARGET_PRECISION), None)
    threshold = recommendation["threshold"] if recommendation else None
    if threshold is None:
        return {
            f"{prefix}recommended_threshold": None,
            f"{prefix}recommended_precision_heldout": None,
        }
    (point,) = precision_coverage(confidences, right, [threshold])
    return {
        f"{prefix}recommended_threshold": threshold,
        f"{prefix}recommended_precision_heldout": point.precision,
        f"{prefix}recommended_coverage_heldout": point.coverage,
    }


def _memory_only(calibration: Calibration | None, evaluation: Evaluation) -> dict[str, Any]:
    """Answering from memory alone, by the memory-only confidence, on the held-out messages:
    how calibrated it is, and what its recommended threshold for 95% gives."""
    fit = calibration.memory_fit if calibration else None
    if not fit or not evaluation.memory_confidences:
        return {"memory_calibrated_n": 0}
    confidences, right = evaluation.memory_confidences, evaluation.memory_right
    return {
        "memory_calibrated_n": len(confidences),
        "memory_accuracy": sum(right) / len(right),
        "memory_ece": expected_calibration_error(confidences, right),
        "memory_ece_ci": list(ece_interval(confidences, right)),
        **_recommended(fit["recommendations"], confidences, right, prefix="memory_"),
    }


def _latest_candidates(item: Item) -> list[Candidate]:
    generation = item.generations.order_by("-created_at").first()
    assert generation is not None
    return list(generation.candidates.filter(status="done").order_by("position"))


def _no_retrieval(bench: Bench, rows: list[Labelled]) -> tuple[int, int]:
    items = _generate(bench, bench.plain, rows)
    hits = 0
    for item, row in zip(items, rows, strict=True):
        candidates = _candidates(item)
        hits += bool(candidates) and label_of(candidates[0].text, bench.labels) == row.label
    return hits, len(items)


def _random_examples(bench: Bench, rows: list[Labelled], rng: random.Random) -> tuple[int, int]:
    """The control: the same prompt, with stored examples drawn at random instead of retrieved.
    If this matched retrieval, similarity would not be what helps."""
    preferred = list(Example.objects.filter(queue=bench.queue, role=Example.Role.PREFERRED))
    hits = 0
    for row in rows:
        shown = rng.sample(preferred, min(bench.queue.k_examples, len(preferred)))
        messages = messages_build(
            system_prompt=bench.queue.system_prompt,
            playbook="",
            playbook_version=None,
            examples=_as_sent(bench, shown),
            request=row.text,
            framing=bench.queue.example_framing,
        )
        try:
            answer = llm.complete(
                messages=messages,
                model=settings.LLM_MODEL,
                params={"temperature": bench.temperature, "max_tokens": MAX_TOKENS},
            ).text
        except llm.LLMError:
            answer = ""
        hits += label_of(answer, bench.labels) == row.label
    return hits, len(rows)


def _as_sent(bench: Bench, examples: list[Example]) -> list[PromptExample]:
    """Examples as the queue sends them: with rewards and rivals when it puts them beside."""
    if not bench.queue.example_rewards:
        return [PromptExample.of(e) for e in examples]
    rivals = examples_rivals(examples=examples)
    return [PromptExample.of(e, rewarded=True, rivals=rivals[e.pk]) for e in examples]


def _off_topic(bench: Bench) -> tuple[int, int]:
    """How many unrelated requests memory reaches: examples in the prompt, or stored answers
    offered (retrieved as a generation does, through the worker that owns the store)."""
    queue = Queue.objects.get(pk=bench.queue.pk)
    reached = 0
    for text in OFF_TOPIC:
        recall = examples_recall_anywhere(
            queue=queue,
            query_text=text,
            k=queue.k_examples,
            token_budget=queue.example_token_budget,
            pool=MEMORY_NEIGHBOURS,
        )
        reached += bool(recall.examples or recall.neighbours)
    return reached, len(OFF_TOPIC)


# What each playbook arm reports: the first candidate, the model's own answers beside the
# examples (where a rule can act: memory's candidates are the same in every arm) and N's.
_ARM_RATES = ("first_accuracy", "llm_with_examples", "acceptance")


def _playbook(
    bench: Bench, options: dict[str, Any], rng: random.Random, *, size: int
) -> dict[str, Any]:
    baseline = bench.held_out[: options["baseline"]]

    def evaluate() -> dict[str, Any]:
        counts = _evaluate(bench, memory_size=size).counts
        return summarise({rate: counts[rate] for rate in _ARM_RATES})

    return playbook_arms(
        queue=bench.queue,
        plain=bench.plain,
        reviewer=bench.reviewer,
        rounds=options["playbook_rounds"],
        rng=rng,
        evaluate=evaluate,
        alone=lambda: summarise({"no_retrieval": _no_retrieval(bench, baseline)}),
    )


def _sweep_row(bench: Bench, minimum: float, evaluation: Evaluation) -> dict[str, Any]:
    return {
        "minimum": minimum,
        **summarise({**evaluation.counts, "off_topic_with_examples": _off_topic(bench)}),
        "llm_calls_saved": evaluation.llm_calls_saved,
    }


def _minimum_set(bench: Bench, minimum: float) -> None:
    Queue.objects.filter(pk=bench.queue.pk).update(min_similarity=minimum)


def measure(options: dict[str, Any], sizes: list[int]) -> dict[str, Any]:
    bench = _bench_build(options, stream_size=max(sizes))
    rng = random.Random(options["seed"])
    # Does not depend on memory: measured once, on the first held-out messages.
    no_retrieval = _no_retrieval(bench, bench.held_out[: options["baseline"]])
    counts_by_size: dict[int, Counts] = {}
    extra_by_size: dict[int, dict[str, Any]] = {}
    # The curve runs at the queue's minimum similarity; at the swept sizes the held-out
    # messages are generated again at each other minimum, with the same memory.
    main_minimum = options["min_similarity"]
    minimums = sorted({*options["sweep"], main_minimum})
    sweep: dict[str, list[dict[str, Any]]] = {}
    stored = 0
    playbook: dict[str, Any] = {}
    for size in sizes:
        # In steps of LEARNING_STEP, each generated with the memory the steps before left
        # and followed by a refit, as traffic and the periodic refit go in production (one
        # batch would generate all of them with the memory of the size before).
        for start in range(stored, size, LEARNING_STEP):
            _learn(bench, bench.stream[start : min(size, start + LEARNING_STEP)])
        stored = size
        evaluation = _evaluate(bench, memory_size=size)
        calibration = calibration_latest(queue_id=bench.queue.pk)
        control_rows = bench.held_out[: options["control"]] if size else []
        counts_by_size[size] = {
            **evaluation.counts,
            "no_retrieval": no_retrieval,
            "random_examples": _random_examples(bench, control_rows, rng),
        }
        if size in options["sweep_sizes"]:
            rows = []
            for minimum in minimums:
                if minimum == main_minimum:
                    rows.append(_sweep_row(bench, minimum, evaluation))
                    continue
                _minimum_set(bench, minimum)
                rows.append(_sweep_row(bench, minimum, _evaluate(bench, memory_size=size)))
            _minimum_set(bench, main_minimum)
            sweep[str(size)] = rows
        if options["try_again"] and size == sizes[-1] and size:
            # After the sweep: trying again adds to memory only once the items are decided,
            # which they never are here.
            counts_by_size[size].update(_recovery(bench, evaluation.missed))
        if options["playbook_rounds"] and size == sizes[-1] and size:
            playbook = _playbook(bench, options, rng, size=size)
        extra_by_size[size] = {
            **_recommended(
                calibration.recommendations if calibration else [],
                evaluation.confidences,
                evaluation.first_right,
            ),
            **_memory_only(calibration, evaluation),
            "confidence_fit": "isotonic" if calibration and calibration.isotonic else "platt",
            "llm_calls_saved": evaluation.llm_calls_saved,
            **confidence_summary(
                evaluation.confidences,
                evaluation.first_right,
                history_curve=calibration.curve if calibration else [],
            ),
        }
    return {
        "sizes": {
            str(size): {**summarise(counts), **extra_by_size[size]}
            for size, counts in counts_by_size.items()
        },
        "significance": significance(counts_by_size),
        "playbook": playbook,
        "reflector": settings.REFLECTOR_MODEL,
        "min_similarity": main_minimum,
        "framing": bench.queue.example_framing,
        "example_rewards": bench.queue.example_rewards,
        "ratings": bench.ratings,
        "dataset": Path(options["dataset"]).name,
        "votes": "verbatim" if options["verbatim_votes"] else "label",
        "min_similarity_sweep": sweep,
        "chosen_min_similarity": minimum_choose(sweep, tolerance=options["tolerance"])
        if sweep
        else None,
        "min_similarity_tolerance": options["tolerance"],
        "test": len(bench.held_out),
        "candidates": bench.queue.n_candidates,
        "memory_candidates": bench.queue.memory_candidates,
        "temperature": bench.temperature,
        "seed": options["seed"],
        "finished_at": time.time(),
    }
