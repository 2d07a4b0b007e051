"""The worker's pipeline for one generation, and its state machine: prepare (retrieve, build
the prompt, offer memory candidates, fan out), generate each candidate, fail or finish.
Every step claims its row with a conditional UPDATE and a lease, so a redelivered or
re-swept task never does the work twice."""

import logging
import random
from collections.abc import Callable
from contextlib import nullcontext
from datetime import timedelta
from functools import partial
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Count, Exists, F, Q
from django.utils import timezone

from icrlhf.generation import endpoint_share, ranking, selectors, signals, tasks
from icrlhf.generation.context import (
    Prompt,
    PromptContext,
    Room,
    prompt_context,
    request_signature,
)
from icrlhf.generation.models import Candidate, Generation
from icrlhf.integrations import database, llm
from icrlhf.kinds import kind_of
from icrlhf.memory import selectors as memory_selectors
from icrlhf.memory import services as memory_services
from icrlhf.memory.signatures import PLAIN
from icrlhf.queues.models import Item, Queue

logger = logging.getLogger(__name__)

# A claimed row whose worker died is claimable again once its lease runs out. Preparing takes
# a second or two at most (the store and the embedder time out sooner), so a worker killed
# mid-prepare delays its generation by a minute, not five.
_PREPARE_LEASE = timedelta(minutes=1)


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


# A transient failure's retries wait 2, 4, 8 … seconds (with jitter), never longer than this.
RETRY_BACKOFF_MAX_S = 60


def _candidate_lease() -> timedelta:
    return timedelta(seconds=settings.LLM_TIMEOUT_S + 30)


def generation_prepare(*, generation_id: int, inline: bool = False) -> list[int]:
    """Retrieve examples, build and store the exact messages, and fan out the candidates:
    through the broker, or, `inline`, right here (the caller's worker consumes the LLM
    queue too, so the broker's hand-over would only add its round trip).

    Returns the ids of the candidates fanned out (none when someone else has the generation).
    """
    generation = _generation_claim_to_prepare(generation_id)
    if generation is None:
        return []
    item, queue = generation.item, generation.item.queue
    # What memory held at preparation, recorded with the generation; retrieval skips an
    # empty memory by it.
    preferred = memory_selectors.preferred_count(queue=queue)
    context = _retrieved(generation=generation, preferred=preferred)
    earlier = selectors.attempts_earlier(
        item=item, before=generation, token_budget=queue.example_token_budget
    )
    prompt = context.fitted(
        examples=context.recall.examples,
        attempts=earlier.attempts,
        attempts_feedback=earlier.feedback,
        room=Room.of_call(
            model=generation.model,
            api_base=generation.api_base,
            params=generation.params,
            options=item.call_options,
        ),
    )
    with transaction.atomic():
        _preparation_record(
            generation=generation, context=context, prompt=prompt, preferred=preferred
        )
        candidates = list(generation.candidates.order_by("pk"))
        pending = [c for c in candidates if c.status == Candidate.Status.PENDING]
        answered = _memory_candidates_fill(
            pending=pending,
            # A stored tool call is not offered again: its arguments were for its own state.
            neighbours=context.recall.neighbours if context.signature == PLAIN else [],
            queue=queue,
            # An answer already among the candidates (one served to an application), or one
            # a reviewer sent back with "try again".
            present={c.text.strip() for c in candidates if c.status == Candidate.Status.DONE}
            | earlier.sent_back,
        )
        candidate_ids = [c.pk for c in pending[answered:]]
        generating_here: list[Candidate] = []
        if candidate_ids and inline:
            generating_here = _candidates_claim_prepared(pending[answered:])
        elif candidate_ids:
            priority = fair_priority(generation_id=generation_id, queue_id=queue.pk)
            # One message for all of them: one worker thread calls the model N times at once.
            transaction.on_commit(
                lambda: tasks.candidates_generate.apply_async((candidate_ids,), priority=priority),
                robust=True,
            )
    if not candidate_ids:
        generation_finish_if_complete(generation_id=generation_id)
    elif generating_here:
        generation.messages = prompt.messages
        _candidates_run_in_share(generating_here, run=_candidates_run_or_fail)
    return candidate_ids


def _generation_claim_to_prepare(generation_id: int) -> Generation | None:
    """The generation, if this worker may prepare it: pending, or preparing under a lease
    that ran out (its worker died). None when someone else has it."""
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
        return None
    return Generation.objects.select_related("item__queue").get(pk=generation_id)


def _retrieved(*, generation: Generation, preferred: int) -> PromptContext:
    """The item's request readied for the model, with what memory retrieved for it."""
    item = generation.item
    # A captured gateway call is the next step of the caller's conversation, with its tools.
    signature = request_signature(conversation=item.conversation, options=item.call_options)
    context = prompt_context(
        queue=item.queue,
        query_text=item.input_text,
        conversation=item.conversation,
        signature=signature,
        pool=ranking.MEMORY_NEIGHBOURS,  # for memory candidates and for the ranking
        retrieve=partial(memory_selectors.examples_recall, preferred=preferred),
        # A captured call's review gets the format examples its token's calls would get
        # (only a request with tools gets any: no query for the others).
        token_id=selectors.item_token_id(item=item) if signature.tool_names else None,
    )
    if context.memory_error is not None:
        logger.warning(
            "Retrieval skipped for generation %s: %s", generation.pk, context.memory_error
        )
    return context


def _preparation_record(
    *, generation: Generation, context: PromptContext, prompt: Prompt, preferred: int
) -> None:
    """Store what the preparation made: the exact messages, the examples they carry (those
    that fit the model's window), the neighbours the ranking reads, what the minimum left
    out, and, when memory was unavailable, why the candidates have no examples."""
    recall = context.recall
    memory_services.retrievals_record(generation_id=generation.pk, retrieved=prompt.examples)
    Generation.objects.filter(pk=generation.pk).update(
        status=Generation.Status.RUNNING,
        messages=prompt.messages,
        # The reviewer sees why the candidates were written without examples.
        retrieval_error="Memory was unavailable, so no examples were retrieved."
        if context.memory_error is not None
        else "",
        retrieval_ms=int(context.retrieval_ms),
        playbook_id=context.playbook.version_id,
        neighbours=[
            n.as_json() for n in ranking.neighbours_of(queue=generation.item.queue, recall=recall)
        ],
        stored_examples=preferred,
        min_similarity=recall.minimum,
        below_minimum=[
            {"example": str(hit.example.pk), "score": hit.score} for hit in recall.below_minimum
        ],
        prepared_at=timezone.now(),
        lease_expires_at=None,
    )


def _candidates_claim_prepared(candidates: list[Candidate]) -> list[Candidate]:
    """Claim the pending candidates of the generation being prepared, in its transaction
    (what `_candidates_claim` does for a task, without reading them again). Returns them,
    or none if some were taken or locked: those this claim did get are swept again when
    their own lease runs out."""
    claim = _claim_fields()
    # Rows another transaction holds are skipped, not waited for: waiting on a row while this
    # transaction holds its siblings could deadlock with a statement that updates many.
    claimable = Candidate.objects.filter(
        pk__in=[c.pk for c in candidates], status=Candidate.Status.PENDING
    ).select_for_update(skip_locked=True)
    claimed = Candidate.objects.filter(pk__in=claimable.values("pk")).update(
        attempts=F("attempts") + 1, **claim
    )
    if claimed != len(candidates):
        logger.warning("Candidates of a generation being prepared were taken: left to the sweep")
        return []
    for candidate in candidates:
        candidate.attempts += 1
        for name, value in claim.items():
            setattr(candidate, name, value)
    return candidates


def _memory_candidates_fill(
    *,
    pending: list[Candidate],
    neighbours: list[memory_selectors.RetrievedExample],
    queue: Queue,
    present: set[str],
) -> int:
    """Offer the preferred answers of the closest stored examples as the first candidates:
    an answer reviewers already accepted for a near-identical request is often the right
    one, and it costs no LLM call. Distinct answers only (by the kind's vote key: one offer
    per intent or per ticket category and priority), nearest first."""
    kind = kind_of(queue)
    offers: list[memory_selectors.RetrievedExample] = []
    seen = {kind.vote_key(text=text, queue=queue) for text in present}
    for hit in neighbours:
        key = kind.vote_key(text=hit.example.output_text.strip(), queue=queue)
        if hit.score < queue.memory_min_similarity or key in seen:
            continue
        seen.add(key)
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


def candidates_generate(
    *, candidate_ids: list[int], woken: bool = False, place: float | None = None
) -> None:
    """Claim the candidates, call the model for all of them at once, and save each answer or
    error the moment it arrives (the item page shows candidates as they come).

    A transient error puts its candidate back to pending and schedules it again, alone, with
    backoff. Attempts are capped on the row, not on a task: a candidate enqueued again (by
    the sweeper, by a redelivery) never calls the model more than LLM_MAX_RETRIES + 1 times.
    The model is called within review's share of its endpoint (endpoint_share.py); while that
    is all in use, the candidates wait in line for it, their attempt not counted (back at
    their `place`, when they were woken from it and a newcomer took the slot first). A
    candidate stopped meanwhile (its item decided) is not claimed: the task returns without
    calling the model, and, `woken` for a slot given back, passes the slot on to the next in
    line.
    """
    claimed = _candidates_claim(candidate_ids)
    if claimed:
        _candidates_run_in_share(claimed, run=_candidates_run, place=place)
    elif woken:
        api_base = Generation.objects.filter(candidates__pk__in=candidate_ids).values_list(
            "api_base", flat=True
        )
        for base in set(api_base):
            _share_wake(api_base=base)


def _candidates_run_in_share(
    claimed: list[Candidate],
    *,
    run: Callable[[list[Candidate]], None],
    place: float | None = None,
) -> None:
    """`run` the claimed candidates within review's share of their endpoint; when it is all
    in use, they wait in line for it instead (endpoint_share.py; at their `place` when they
    held one), and the call that gives its slot back wakes the first in line."""
    api_base = claimed[0].generation.api_base
    slot = endpoint_share.slot_take(api_base=api_base)
    if slot is None:
        _candidates_wait_for_share(claimed, place=place)
        return
    try:
        run(claimed)
    finally:
        endpoint_share.slot_give_back(slot)
        if slot.key:  # counted: others may be waiting for it (uncounted, none can be)
            _share_wake(api_base=api_base)


# A generation in line for its endpoint's share is woken when a slot is given back. Its ask
# is due by this long at the latest (`retry_at`): once that is GENERATION_LOST_AFTER_S
# overdue, the sweeper sends it again, in case its wake was lost (the cache flushed, a worker
# killed between its call and the wake); one still in line keeps its place. A hundred
# generations waiting so cost the worker about one task every two seconds.
SHARE_WAIT_DUE_S = 60
# Without the cache's line (it failed meanwhile), a generation asks again after this long.
SHARE_WAIT_UNLINED_S = 1.0


def _candidates_wait_for_share(claimed: list[Candidate], *, place: float | None = None) -> None:
    """Put claimed candidates back to pending, their attempt not counted (the model was not
    asked), in their endpoint's line at their fair priority. `retry_at` tells the sweeper
    when their ask is overdue (recovery.py)."""
    generation = claimed[0].generation
    priority = fair_priority(generation_id=generation.pk, queue_id=generation.item.queue_id)
    candidate_ids = [c.pk for c in claimed]
    waiting = Candidate.objects.filter(
        pk__in=candidate_ids, status=Candidate.Status.RUNNING
    ).update(
        status=Candidate.Status.PENDING,
        attempts=F("attempts") - 1,
        lease_expires_at=None,
        retry_at=timezone.now() + timedelta(seconds=SHARE_WAIT_DUE_S),
    )
    if waiting:  # none: stopped meanwhile (the item was decided)
        transaction.on_commit(
            lambda: _share_line_join(
                api_base=generation.api_base,
                candidate_ids=candidate_ids,
                priority=priority,
                place=place,
            ),
            robust=True,
        )


def _share_line_join(
    *, api_base: str, candidate_ids: list[int], priority: int, place: float | None
) -> None:
    if not endpoint_share.wait_in_line(
        api_base=api_base, candidate_ids=candidate_ids, priority=priority, place=place
    ):
        tasks.candidates_generate.apply_async(
            (candidate_ids,), countdown=SHARE_WAIT_UNLINED_S, priority=priority
        )
        return
    # A slot given back between this one's ask and its joining the line woke nobody.
    slot = endpoint_share.slot_take(api_base=api_base)
    if slot is not None:
        endpoint_share.slot_give_back(slot)
        _share_wake(api_base=api_base)


def _share_wake(*, api_base: str) -> None:
    """Sends the first in the endpoint's line to take the slot just given back."""
    woken = endpoint_share.next_in_line(api_base=api_base)
    if woken is not None:
        tasks.candidates_generate.apply_async(
            (woken.candidate_ids,), {"woken": True, "place": woken.place}, priority=0
        )


def _candidates_run(claimed: list[Candidate]) -> None:
    """Generate candidates of one generation, claimed (each with its generation, item and
    queue)."""
    generation = claimed[0].generation
    queue = generation.item.queue
    call = llm.Call(
        messages=generation.messages,
        model=generation.model,
        params=generation.params,
        api_base=generation.api_base,
        response_format=kind_of(queue).response_format(queue),
        options=generation.item.call_options,
    )
    for arrived in llm.complete_n(call, len(claimed)):
        _candidates_save([(claimed[index], outcome) for index, outcome in arrived], queue=queue)
    generation_finish_if_complete(
        generation_id=generation.pk, item_id=generation.item_id, queue_id=queue.pk
    )


def _candidates_run_or_fail(claimed: list[Candidate]) -> None:
    """`_candidates_run`, failing its candidates if it fails, so that none is left running."""
    candidate_ids = [c.pk for c in claimed]
    try:
        _candidates_run(claimed)
    except Exception:
        logger.exception("Generating candidates %s failed", candidate_ids)
        candidates_fail_on_bug(candidate_ids=candidate_ids)


def candidates_fail_on_bug(*, candidate_ids: list[int]) -> None:
    """Fail the candidates still unsettled when generating them failed on a bug (a model's
    errors are saved on the candidates themselves), so that none is left running."""
    for candidate_id in candidate_ids:
        candidate_fail(
            candidate_id=candidate_id,
            message="Generation failed because of an internal error; it was logged.",
        )


def candidate_generate(*, candidate_id: int) -> None:
    """One candidate: a retry, a sweep, or a failed candidate tried again."""
    candidates_generate(candidate_ids=[candidate_id])


def _claim_fields() -> dict[str, Any]:
    """What claiming a candidate sets, besides counting the attempt."""
    now = timezone.now()
    return {
        "status": Candidate.Status.RUNNING,
        "lease_expires_at": now + _candidate_lease(),
        "started_at": now,
        "retry_at": None,
    }


def _candidates_claim(candidate_ids: list[int]) -> list[Candidate]:
    """The candidates this call may generate: pending, or running with an expired lease (its
    worker died), and not out of attempts; those out of attempts are failed here."""
    now = timezone.now()
    max_attempts = settings.LLM_MAX_RETRIES + 1
    claimable = Candidate.objects.filter(pk__in=candidate_ids).filter(
        Q(status=Candidate.Status.PENDING)
        | Q(status=Candidate.Status.RUNNING, lease_expires_at__lt=now)
    )
    with transaction.atomic():
        # Locked rows are being claimed by another task, which will have them.
        rows = list(claimable.select_for_update(skip_locked=True).values_list("pk", "attempts"))
        ids = [pk for pk, attempts in rows if attempts < max_attempts]
        Candidate.objects.filter(pk__in=ids).update(attempts=F("attempts") + 1, **_claim_fields())
        exhausted = [pk for pk, attempts in rows if attempts >= max_attempts]
    for pk in exhausted:
        last_error = Candidate.objects.values_list("error", flat=True).get(pk=pk)
        reason = last_error.removeprefix("Retrying: ") or "Its worker stopped while generating."
        candidate_fail(candidate_id=pk, message=f"Gave up after {max_attempts} attempts. {reason}")
    return list(
        Candidate.objects.filter(pk__in=ids)
        .select_related("generation__item__queue")
        .order_by("pk")
    )


def _candidates_save(
    arrived: list[tuple[Candidate, llm.Completion | llm.LLMError]], *, queue: Queue
) -> None:
    """Save the outcomes that arrived together (one request answering all N) in one commit,
    the answers in one statement."""
    now = timezone.now()
    answers: dict[int, dict[str, Any]] = {}
    errors: list[tuple[Candidate, llm.LLMError]] = []
    for candidate, outcome in arrived:
        if isinstance(outcome, llm.LLMError):
            errors.append((candidate, outcome))
            continue
        parsed = kind_of(queue).parse(outcome.text, queue)
        answers[candidate.pk] = {
            "status": Candidate.Status.DONE,
            "fields": parsed.fields,
            "parse_error": parsed.error,
            "text": outcome.text,
            "tool_calls": list(outcome.tool_calls),
            "error": "",
            "model": outcome.model,
            "latency_ms": outcome.latency_ms,
            "prompt_tokens": outcome.prompt_tokens,
            "completion_tokens": outcome.completion_tokens,
            "cost_usd": outcome.cost_usd,
            "finished_at": now,
            "lease_expires_at": None,
        }
    # The answers alone are one statement, a transaction of its own: BEGIN and COMMIT around
    # it would only add two round trips on PostgreSQL.
    with transaction.atomic() if errors else nullcontext():
        for candidate, error in errors:
            _candidate_error_save(candidate, error)
        # Only while running: one failed or taken back meanwhile keeps its state.
        database.rows_update(Candidate, answers, where={"status": Candidate.Status.RUNNING})


def _candidate_error_save(candidate: Candidate, error: llm.LLMError) -> None:
    if isinstance(error, llm.TransientLLMError):
        countdown = _retry_countdown(candidate)
        released = Candidate.objects.filter(
            pk=candidate.pk, status=Candidate.Status.RUNNING
        ).update(
            status=Candidate.Status.PENDING,
            error=f"Retrying: {error}",
            lease_expires_at=None,
            retry_at=timezone.now() + timedelta(seconds=countdown),
        )
        if released:
            _retry_schedule(candidate, countdown=countdown)
        return
    candidate_fail(candidate_id=candidate.pk, message=str(error), finish=False)


def _retry_countdown(candidate: Candidate) -> float:
    """Exponential backoff with full jitter (2, 4, 8 … s, at most 60), so calls a rate limit
    refused together do not all come back at the same moment."""
    return random.uniform(0, min(RETRY_BACKOFF_MAX_S, 2**candidate.attempts))


def _retry_schedule(candidate: Candidate, *, countdown: float) -> None:
    """Again later, alone, after `countdown` seconds."""
    priority = fair_priority(
        generation_id=candidate.generation_id, queue_id=candidate.generation.item.queue_id
    )
    transaction.on_commit(
        lambda: tasks.candidate_generate.apply_async(
            (candidate.pk,), countdown=countdown, priority=priority
        ),
        robust=True,
    )


def candidate_fail(*, candidate_id: int, message: str, finish: bool = True) -> None:
    """`finish=False`: the caller settles the generation itself, once for all its candidates."""
    updated = Candidate.objects.filter(
        pk=candidate_id, status__in=[Candidate.Status.PENDING, Candidate.Status.RUNNING]
    ).update(
        status=Candidate.Status.FAILED,
        error=message,
        finished_at=timezone.now(),
        lease_expires_at=None,
    )
    if updated and finish:
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


def generation_finish_if_complete(
    *, generation_id: int, item_id: int | None = None, queue_id: int | None = None
) -> None:
    """Called after each candidate settles; the one that settles last flips the item (its
    item's and queue's ids, when the caller has them, save reading them).

    Each caller has committed its own candidate first, so the last of them sees all settled;
    the conditional UPDATEs make a second flip harmless.
    """
    settled = Candidate.objects.filter(generation_id=generation_id).aggregate(
        unsettled=Count(
            "pk", filter=Q(status__in=[Candidate.Status.PENDING, Candidate.Status.RUNNING])
        ),
        done=Count("pk", filter=Q(status=Candidate.Status.DONE)),
    )
    if settled["unsettled"]:
        return
    any_done = settled["done"] > 0
    running = Generation.objects.filter(pk=generation_id, status=Generation.Status.RUNNING)
    with transaction.atomic():
        if item_id is None or queue_id is None:
            item_id, queue_id = Generation.objects.values_list("item_id", "item__queue_id").get(
                pk=generation_id
            )
        # The item's row before the generation's: the order every flow locks in
        # (queues.locks), so a decision landing as the last candidate settles cannot deadlock
        # with it. The item only follows a generation still running: one already flipped
        # by another caller (or replaced by a regenerate) is not this call's to settle.
        Item.objects.filter(pk=item_id, status=Item.Status.GENERATING).filter(
            Exists(running)
        ).update(
            status=Item.Status.READY if any_done else Item.Status.FAILED,
            updated_at=timezone.now(),
        )
        flipped = running.update(
            status=Generation.Status.DONE if any_done else Generation.Status.FAILED,
            finished_at=timezone.now(),
        )
        if not flipped:
            return
        if any_done:
            # In the memory worker, which embeds, one step behind its queue's fair priority:
            # a decision's indexing and a generation's retrieval (priority 0) go first, and a
            # flood's rankings do not go ahead of other queues' work. The item is ready
            # meanwhile: unranked, its candidates keep their order until the ranking lands.
            priority = min(
                _LOWEST_PRIORITY, 1 + fair_priority(generation_id=generation_id, queue_id=queue_id)
            )
            transaction.on_commit(
                lambda: tasks.generation_rank.apply_async((generation_id,), priority=priority),
                robust=True,
            )


def generation_rank(*, generation_id: int) -> None:
    """Rank a finished generation, then say so: the review app may apply its first candidate."""
    if ranking.generation_rank(generation_id=generation_id):
        signals.generation_ranked.send(sender=Generation, generation_id=generation_id)
