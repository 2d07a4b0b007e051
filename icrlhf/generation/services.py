import logging
import random
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import F, Q
from django.db.models.functions import Coalesce
from django.utils import timezone

from icrlhf.generation import selectors, tasks
from icrlhf.generation.models import Candidate, Generation
from icrlhf.generation.prompts import PromptExample, messages_build
from icrlhf.integrations import llm
from icrlhf.integrations.embeddings import EmbeddingModelMissing
from icrlhf.integrations.vectors import VectorStoreUnavailable
from icrlhf.kinds import kind_of
from icrlhf.memory import selectors as memory_selectors
from icrlhf.memory import services as memory_services
from icrlhf.queues import services as queue_services
from icrlhf.queues.models import Item, Queue

logger = logging.getLogger(__name__)

# A claimed row whose worker died is claimable again once its lease runs out.
_PREPARE_LEASE = timedelta(minutes=5)
# Memory candidates are drawn from this many nearest stored requests, not only from the k in
# the prompt: near neighbours often share one answer, and distinct answers are what is offered.
MEMORY_NEIGHBOURS = 20


# Broker priorities 0 (served first) to 9: CELERY_BROKER_TRANSPORT_OPTIONS["priority_steps"].
_LOWEST_PRIORITY = 9
_UNFINISHED = (Generation.Status.PENDING, Generation.Status.PREPARING, Generation.Status.RUNNING)


def fair_priority(*, generation_id: int, queue_id: int) -> int:
    """The broker priority of a generation's tasks: how many of its own queue's unfinished
    generations are in line before it (0, 1, 2–3, 4–7, … 256 and more → 9).

    One worker queue is first come, first served: a flood in one queue would make every
    other queue wait behind all of it. Ranked this way, the next item of a queue with nothing
    waiting goes ahead of the flood's backlog, and floods in two queues are served in turn.
    """
    ahead = Generation.objects.filter(
        item__queue_id=queue_id, status__in=_UNFINISHED, pk__lt=generation_id
    ).count()
    return min(_LOWEST_PRIORITY, ahead.bit_length())


def _candidate_lease() -> timedelta:
    return timedelta(seconds=settings.LLM_TIMEOUT_S + 30)


@transaction.atomic
@transaction.atomic
def item_create(
    *,
    queue: Queue,
    input_text: str,
    created_by: User | None,
    n_candidates: int | None = None,
    source: str = Item.Source.UI,
    **ticket_fields: Any,
) -> Item:
    """Create an item and start its first generation (enqueued once the transaction commits).

    `ticket_fields` are Item's ticket columns (subject, body, customer, channel, priority,
    sla_due_at, external_id, category), already validated by the caller."""
    text = queue_services.item_input_validate(input_text=input_text)
    count = queue_services.candidate_count_validate(
        n_candidates=queue.n_candidates if n_candidates is None else n_candidates
    )
    item = Item.objects.create(
        queue=queue,
        input_text=text,
        source=source,
        created_by=created_by,
        status=Item.Status.GENERATING,
        **ticket_fields,
    )
    generation_start(item=item, n_candidates=count)
    return item


def generation_start(*, item: Item, n_candidates: int) -> Generation:
    """Create a generation and its N pending candidates; prepare it once this commits."""
    queue = item.queue
    generation = Generation.objects.create(
        item=item,
        model=queue.model or settings.LLM_MODEL,
        api_base=queue.api_base,  # empty: the worker's LLM_API_BASE
        params={"temperature": queue.temperature, "max_tokens": queue.max_tokens},
        n_candidates=n_candidates,
    )
    positions = random.sample(range(n_candidates), n_candidates)
    Candidate.objects.bulk_create(
        Candidate(generation=generation, position=position) for position in positions
    )
    # robust: with the broker down the item is still saved; the sweeper enqueues it later.
    priority = fair_priority(generation_id=generation.pk, queue_id=queue.pk)
    transaction.on_commit(
        lambda: tasks.generation_prepare.apply_async((generation.pk,), priority=priority),
        robust=True,
    )
    return generation


@transaction.atomic
def candidate_retry(*, candidate_id: int) -> None:
    """Try a failed candidate again; its item shows it when it arrives."""
    candidate = Candidate.objects.select_related("generation__item").get(pk=candidate_id)
    retried = Candidate.objects.filter(pk=candidate_id, status=Candidate.Status.FAILED).update(
        status=Candidate.Status.PENDING, error="", attempts=0, finished_at=None
    )
    if not retried:
        raise ValidationError("Only a failed candidate can be retried.")
    Generation.objects.filter(pk=candidate.generation_id).update(
        status=Generation.Status.RUNNING, finished_at=None
    )
    Item.objects.filter(pk=candidate.generation.item_id, status=Item.Status.FAILED).update(
        status=Item.Status.GENERATING
    )
    priority = fair_priority(
        generation_id=candidate.generation_id, queue_id=candidate.generation.item.queue_id
    )
    transaction.on_commit(
        lambda: tasks.candidate_generate.apply_async((candidate_id,), priority=priority),
        robust=True,
    )


@transaction.atomic
def generation_regenerate(*, item_id: int) -> Generation:
    """A fresh set of candidates for an undecided item (the old ones stay on record)."""
    item = Item.objects.select_for_update().select_related("queue").get(pk=item_id)
    if item.status not in {Item.Status.READY, Item.Status.FAILED}:
        raise ValidationError(
            f"An item that is {item.get_status_display().lower()} cannot be regenerated."
        )
    if item.decisions.standing().exists():
        raise ValidationError("This item already has a decision; it cannot be regenerated.")
    item.status = Item.Status.GENERATING
    item.save(update_fields=["status", "updated_at"])
    previous = selectors.generation_latest(item=item)
    count = previous.n_candidates if previous else item.queue.n_candidates
    return generation_start(item=item, n_candidates=count)


def generation_prepare(*, generation_id: int) -> list[int]:
    """Retrieve examples, build and store the exact messages, and fan out the candidates.

    Returns the ids of the candidates enqueued (none when someone else has the generation).
    """
    now = timezone.now()
    claimed = (
        Generation.objects.filter(pk=generation_id)
        .filter(
            Q(status=Generation.Status.PENDING)
            | Q(status=Generation.Status.PREPARING, lease_expires_at__lt=now)
        )
        .update(status=Generation.Status.PREPARING, lease_expires_at=now + _PREPARE_LEASE)
    )
    if not claimed:
        return []
    generation = Generation.objects.select_related("item__queue").get(pk=generation_id)
    item, queue = generation.item, generation.item.queue

    started = time.monotonic()
    recall = memory_selectors.Recall(examples=[], neighbours=[])
    retrieval_error = ""
    try:
        recall = memory_selectors.examples_recall(
            queue=queue,
            query_text=item.input_text,
            k=queue.k_examples,
            token_budget=queue.example_token_budget,
            pool=MEMORY_NEIGHBOURS if queue.memory_candidates else 0,
        )
    except (VectorStoreUnavailable, EmbeddingModelMissing) as error:
        # Better an answer without memory than no answer: the reviewer sees why.
        logger.warning("Retrieval skipped for generation %s: %s", generation_id, error)
        retrieval_error = "Memory was unavailable, so no examples were retrieved."
    retrieved = recall.examples
    retrieval_ms = int((time.monotonic() - started) * 1000)

    messages = messages_build(
        instructions=kind_of(queue).instructions(queue),
        system_prompt=queue.system_prompt,
        guidelines=queue.guidelines,
        guidelines_version=queue.guidelines_version,
        examples=[PromptExample(r.example.input_text, r.example.output_text) for r in retrieved],
        request=item.input_text,
    )
    with transaction.atomic():
        memory_services.retrievals_record(generation_id=generation.pk, retrieved=retrieved)
        Generation.objects.filter(pk=generation_id).update(
            status=Generation.Status.RUNNING,
            messages=messages,
            retrieval_error=retrieval_error,
            retrieval_ms=retrieval_ms,
            prepared_at=timezone.now(),
            lease_expires_at=None,
        )
        pending = list(generation.candidates.filter(status=Candidate.Status.PENDING).order_by("pk"))
        answered = _memory_candidates_fill(
            pending=pending, neighbours=recall.neighbours, queue=queue
        )
        candidate_ids = [c.pk for c in pending[answered:]]
        priority = fair_priority(generation_id=generation_id, queue_id=queue.pk)
        transaction.on_commit(
            lambda: [
                tasks.candidate_generate.apply_async((pk,), priority=priority)
                for pk in candidate_ids
            ],
            robust=True,
        )
    if not candidate_ids:
        generation_finish_if_complete(generation_id=generation_id)
    return candidate_ids


def _memory_candidates_fill(
    *,
    pending: list[Candidate],
    neighbours: list[memory_selectors.RetrievedExample],
    queue: Queue,
) -> int:
    """Offer the preferred answers of the closest stored examples as the first candidates:
    an answer reviewers already accepted for a near-identical request is often the right
    one, and it costs no LLM call. Distinct answers only, nearest first."""
    offers: list[memory_selectors.RetrievedExample] = []
    seen: set[str] = set()
    for hit in neighbours:
        text = hit.example.output_text.strip()
        if hit.score < queue.memory_min_similarity or text in seen:
            continue
        seen.add(text)
        offers.append(hit)
    offers = offers[: min(queue.memory_candidates, len(pending))]
    now = timezone.now()
    for candidate, hit in zip(pending, offers, strict=False):
        parsed = kind_of(queue).parse(hit.example.output_text, queue)
        Candidate.objects.filter(pk=candidate.pk, status=Candidate.Status.PENDING).update(
            status=Candidate.Status.DONE,
            source=Candidate.Source.MEMORY,
            source_example=hit.example,
            text=hit.example.output_text,
            fields=parsed.fields,
            parse_error=parsed.error,
            model="memory",
            latency_ms=0,
            started_at=now,
            finished_at=now,
        )
    return len(offers)


def candidate_generate(*, candidate_id: int) -> None:
    """Claim a candidate, call the model once, save the answer or the error.

    A transient error puts the candidate back to pending and re-raises, so the task retries.
    Attempts are capped on the row, not only on the task: a candidate enqueued again (by the
    sweeper, by a redelivery) never calls the model more than LLM_MAX_RETRIES + 1 times.
    """
    now = timezone.now()
    max_attempts = settings.LLM_MAX_RETRIES + 1
    claimable = Candidate.objects.filter(pk=candidate_id).filter(
        Q(status=Candidate.Status.PENDING)
        | Q(status=Candidate.Status.RUNNING, lease_expires_at__lt=now)
    )
    claimed = claimable.filter(attempts__lt=max_attempts).update(
        status=Candidate.Status.RUNNING,
        lease_expires_at=now + _candidate_lease(),
        attempts=F("attempts") + 1,
        started_at=now,
    )
    if not claimed:
        last_error = claimable.values_list("error", flat=True).first()
        if last_error is not None:  # claimable, but out of attempts
            reason = last_error.removeprefix("Retrying: ") or "Its worker stopped while generating."
            candidate_fail(
                candidate_id=candidate_id,
                message=f"Gave up after {max_attempts} attempts. {reason}",
            )
        return
    candidate = Candidate.objects.select_related("generation__item__queue").get(pk=candidate_id)
    generation = candidate.generation
    queue = generation.item.queue
    try:
        completion = llm.complete(
            messages=generation.messages,
            model=generation.model,
            api_base=generation.api_base,
            params=generation.params,
        )
    except llm.TransientLLMError as error:
        Candidate.objects.filter(pk=candidate_id, status=Candidate.Status.RUNNING).update(
            status=Candidate.Status.PENDING, error=f"Retrying: {error}", lease_expires_at=None
        )
        raise
    except llm.PermanentLLMError as error:
        candidate_fail(candidate_id=candidate_id, message=str(error))
        return
    parsed = kind_of(queue).parse(completion.text, queue)
    Candidate.objects.filter(pk=candidate_id, status=Candidate.Status.RUNNING).update(
        status=Candidate.Status.DONE,
        fields=parsed.fields,
        parse_error=parsed.error,
        text=completion.text,
        error="",
        model=completion.model,
        latency_ms=completion.latency_ms,
        prompt_tokens=completion.prompt_tokens,
        completion_tokens=completion.completion_tokens,
        cost_usd=completion.cost_usd,
        finished_at=timezone.now(),
        lease_expires_at=None,
    )
    generation_finish_if_complete(generation_id=generation.pk)


def candidate_fail(*, candidate_id: int, message: str) -> None:
    updated = Candidate.objects.filter(
        pk=candidate_id, status__in=[Candidate.Status.PENDING, Candidate.Status.RUNNING]
    ).update(
        status=Candidate.Status.FAILED,
        error=message,
        finished_at=timezone.now(),
        lease_expires_at=None,
    )
    if updated:
        generation_id = Candidate.objects.values_list("generation_id", flat=True).get(
            pk=candidate_id
        )
        generation_finish_if_complete(generation_id=generation_id)


def generation_fail(*, generation_id: int, message: str) -> None:
    """The generation could not be prepared: fail its unstarted candidates, hence the item."""
    Candidate.objects.filter(generation_id=generation_id, status=Candidate.Status.PENDING).update(
        status=Candidate.Status.FAILED, error=message, finished_at=timezone.now()
    )
    Generation.objects.filter(
        pk=generation_id, status__in=[Generation.Status.PENDING, Generation.Status.PREPARING]
    ).update(status=Generation.Status.RUNNING, lease_expires_at=None)
    generation_finish_if_complete(generation_id=generation_id)


def generation_finish_if_complete(*, generation_id: int) -> None:
    """Called after each candidate settles; the one that settles last flips the item.

    Each caller has committed its own candidate first, so the last of them sees all settled;
    the conditional UPDATEs make a second flip harmless.
    """
    candidates = Candidate.objects.filter(generation_id=generation_id)
    if candidates.filter(status__in=[Candidate.Status.PENDING, Candidate.Status.RUNNING]).exists():
        return
    any_done = candidates.filter(status=Candidate.Status.DONE).exists()
    with transaction.atomic():
        flipped = Generation.objects.filter(
            pk=generation_id, status=Generation.Status.RUNNING
        ).update(
            status=Generation.Status.DONE if any_done else Generation.Status.FAILED,
            finished_at=timezone.now(),
        )
        if flipped:
            item_id = Generation.objects.values_list("item_id", flat=True).get(pk=generation_id)
            Item.objects.filter(pk=item_id, status=Item.Status.GENERATING).update(
                status=Item.Status.READY if any_done else Item.Status.FAILED,
                updated_at=timezone.now(),
            )


@dataclass(frozen=True)
class Sweep:
    prepare: list[int]  # generation ids to prepare again
    generate: list[int]  # candidate ids to generate again


def generations_sweep(*, broker_idle: bool) -> Sweep:
    """Finds generation work that no task will finish, and says what to enqueue again.

    A running row whose lease expired lost its worker (killed, out of memory): it is claimable
    again (and a candidate out of attempts fails when its task claims it). A pending row has a
    message in the broker, unless the broker lost it (a restart); that is only knowable when
    the broker's queue is empty (`broker_idle`) and the row has waited longer than any retry
    would. Enqueuing twice is harmless: every task claims its row with a conditional UPDATE.
    """
    now = timezone.now()
    generate = set(
        Candidate.objects.filter(
            status=Candidate.Status.RUNNING, lease_expires_at__lt=now
        ).values_list("pk", flat=True)
    )
    prepare = set(
        Generation.objects.filter(
            status=Generation.Status.PREPARING, lease_expires_at__lt=now
        ).values_list("pk", flat=True)
    )
    if broker_idle:
        lost_before = now - timedelta(seconds=settings.GENERATION_LOST_AFTER_S)
        prepare |= set(
            Generation.objects.filter(
                status=Generation.Status.PENDING, created_at__lt=lost_before
            ).values_list("pk", flat=True)
        )
        generate |= set(
            Candidate.objects.filter(
                status=Candidate.Status.PENDING, generation__status=Generation.Status.RUNNING
            )
            .annotate(waiting_since=Coalesce("started_at", "generation__prepared_at"))
            .filter(waiting_since__lt=lost_before)
            .values_list("pk", flat=True)
        )
    return Sweep(prepare=sorted(prepare), generate=sorted(generate))
