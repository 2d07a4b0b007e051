"""Commands from the pages, the API and the tools: create an item and start its generation,
regenerate an item, retry a candidate. The worker's side is `pipeline.py`."""

import random
import uuid
from dataclasses import dataclass, field
from typing import Any

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone

from icrlhf.generation import selectors, tasks
from icrlhf.generation.models import Candidate, Generation
from icrlhf.generation.pipeline import fair_priority, generation_finish_if_complete
from icrlhf.integrations.redaction import scrub
from icrlhf.kinds import kind_of
from icrlhf.memory.models import Example
from icrlhf.queues import services as queue_services
from icrlhf.queues.locks import item_lock
from icrlhf.queues.models import Item, Queue


@dataclass(frozen=True)
class Served:
    """An answer an application already got (a captured gateway call): it becomes one of the
    item's candidates as it was, and the worker generates the others."""

    text: str
    model: str
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    example_id: uuid.UUID | None = None  # answered from memory: the example it came from
    latency_ms: int | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    reward: float | None = None  # the application's reward for it, where it gave one


@transaction.atomic
def item_create(
    *,
    queue: Queue,
    input_text: str,
    created_by: User | None,
    n_candidates: int | None = None,
    source: str = Item.Source.UI,
    served: Served | None = None,
    **item_fields: Any,
) -> Item:
    """Create an item and start its first generation (enqueued once the transaction commits).

    `item_fields` are Item's other columns (the ticket's subject, body, customer, channel,
    priority, sla_due_at, category; external_id, metadata), already validated by the
    caller."""
    text = queue_services.item_input_validate(input_text=input_text)
    count = queue_services.candidate_count_validate(
        n_candidates=queue.n_candidates if n_candidates is None else n_candidates
    )
    item = Item.objects.create(
        queue=queue,
        input_text=scrub(text, into="review"),
        source=source,
        created_by=created_by,
        status=Item.Status.GENERATING,
        **_redacted_fields(item_fields),
    )
    generation_start(item=item, n_candidates=count, served=served)
    return item


# What end users wrote in an item (a ticket's subject, body and customer; a captured call's
# turns): it reaches review, memory and exports only through the one redaction. The sender's
# own fields (external_id, metadata, channel, …) are the application's, returned as sent.
_END_USERS_WORDS = ("subject", "body", "customer", "conversation")


def _redacted_fields(fields: dict[str, Any]) -> dict[str, Any]:
    redacted = dict(fields)
    for name in _END_USERS_WORDS:
        if name not in redacted:
            continue
        value = scrub(redacted[name], into="review")
        # A placeholder may be longer than what it replaced ("a@b.co" is "[email]").
        limit = getattr(Item._meta.get_field(name), "max_length", None)
        redacted[name] = value[:limit] if isinstance(value, str) and limit else value
    return redacted


def item_existing(*, queue: Queue, external_id: str) -> Item | None:
    return Item.objects.filter(queue=queue, external_id=external_id).first()


def item_create_once(*, queue: Queue, external_id: str, **fields: Any) -> tuple[Item, bool]:
    """`item_create`, idempotent on the sender's external id: the item already made for it is
    returned instead (and False), also when two requests with it race."""
    if external_id and (existing := item_existing(queue=queue, external_id=external_id)):
        return existing, False
    try:
        with transaction.atomic():
            return item_create(queue=queue, external_id=external_id, **fields), True
    except IntegrityError:
        # The same external id, sent twice at the same moment: the other request won.
        existing = item_existing(queue=queue, external_id=external_id) if external_id else None
        if existing is None:
            raise
        return existing, False


# No savepoint of its own: its callers' transactions fail whole when it fails.
@transaction.atomic(savepoint=False)
def generation_start(*, item: Item, n_candidates: int, served: Served | None = None) -> Generation:
    """Create a generation and its N pending candidates, one of them the answer already
    `served` if there is one; prepare it once this commits."""
    queue = item.queue
    generation = Generation.objects.create(
        item=item,
        model=queue.llm_model,
        api_base=queue.api_base,  # empty: the worker's LLM_API_BASE
        params={"temperature": queue.temperature, "max_tokens": queue.max_tokens},
        n_candidates=n_candidates,
    )
    positions = random.sample(range(n_candidates), n_candidates)
    candidates = Candidate.objects.bulk_create(
        Candidate(generation=generation, position=position) for position in positions
    )
    if served is not None:
        # At a random position like the others: reviewers judge it blind.
        _served_fill(candidates[0], served=served, queue=queue)
    # robust: with the broker down the item is still saved; the sweeper enqueues it later.
    priority = fair_priority(generation_id=generation.pk, queue_id=queue.pk)
    transaction.on_commit(
        lambda: tasks.generation_prepare.apply_async((generation.pk,), priority=priority),
        robust=True,
    )
    return generation


def _served_of(candidate: Candidate) -> Served:
    return Served(
        text=candidate.text,
        model=candidate.model,
        tool_calls=candidate.tool_calls,
        example_id=candidate.source_example_id,
        latency_ms=candidate.latency_ms,
        prompt_tokens=candidate.prompt_tokens,
        completion_tokens=candidate.completion_tokens,
        reward=candidate.reward,
    )


def _served_fill(candidate: Candidate, *, served: Served, queue: Queue) -> None:
    parsed = kind_of(queue).parse(served.text, queue)
    example_id = served.example_id
    if example_id is not None and not Example.objects.filter(pk=example_id).exists():
        example_id = None  # deleted since it answered
    now = timezone.now()
    Candidate.objects.filter(pk=candidate.pk).update(
        status=Candidate.Status.DONE,
        served=True,
        source=Candidate.Source.LLM if example_id is None else Candidate.Source.MEMORY,
        source_example_id=example_id,
        text=served.text,
        tool_calls=served.tool_calls,
        fields=parsed.fields,
        parse_error=parsed.error,
        model=served.model,
        latency_ms=served.latency_ms,
        prompt_tokens=served.prompt_tokens,
        completion_tokens=served.completion_tokens,
        reward=served.reward,
        started_at=now,
        finished_at=now,
    )


# What a candidate stopped by its item's decision says. Failed, so that its task, a retry
# and the sweeper all leave it alone; no colon, so every reviewer reads the whole sentence.
STOPPED_BY_DECISION = "Stopped because the item was decided before this answer arrived."


@transaction.atomic(savepoint=False)
def generations_stop_if_decided(*, item_id: int) -> int:
    """Once an item is decided (by every reviewer it asks for), nothing more is generated for
    it: its candidates still waiting or generating are stopped, so that their tasks and
    retries find nothing to claim (DESIGN, "Tasks: the rules": no model call) and an answer
    already on its way is not saved; its unfinished generations finish with what they have.
    An item still open to a reviewer (skipped, or waiting for a second one) goes on
    generating: its candidates will be read. Returns how many candidates were stopped."""
    if not Item.objects.filter(pk=item_id, status=Item.Status.DECIDED).exists():
        return 0
    stopped = Candidate.objects.filter(
        generation__item_id=item_id,
        status__in=[Candidate.Status.PENDING, Candidate.Status.RUNNING],
    ).update(
        status=Candidate.Status.FAILED,
        error=STOPPED_BY_DECISION,
        finished_at=timezone.now(),
        lease_expires_at=None,
        retry_at=None,
    )
    unfinished = list(
        Generation.objects.filter(
            item_id=item_id,
            status__in=[
                Generation.Status.PENDING,
                Generation.Status.PREPARING,
                Generation.Status.RUNNING,
            ],
        ).values_list("pk", flat=True)
    )
    # Not prepared yet: a prepare task finds it taken, and returns.
    Generation.objects.filter(
        pk__in=unfinished, status__in=[Generation.Status.PENDING, Generation.Status.PREPARING]
    ).update(status=Generation.Status.RUNNING, lease_expires_at=None)
    for generation_id in unfinished:
        generation_finish_if_complete(generation_id=generation_id)
    return stopped


@transaction.atomic
def candidate_retry(*, candidate_id: int) -> None:
    """Try a failed candidate again; its item shows it when it arrives."""
    candidate = Candidate.objects.select_related("generation__item").get(pk=candidate_id)
    if candidate.generation.item.status == Item.Status.DECIDED:
        raise ValidationError("This item is decided: its candidates are not generated any more.")
    retried = Candidate.objects.filter(pk=candidate_id, status=Candidate.Status.FAILED).update(
        status=Candidate.Status.PENDING, error="", attempts=0, finished_at=None
    )
    if not retried:
        raise ValidationError("Only a failed candidate can be retried.")
    # Ranked again once it is back: a candidate that arrives late is ranked with the others.
    Generation.objects.filter(pk=candidate.generation_id).update(
        status=Generation.Status.RUNNING, finished_at=None, ranked_at=None
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
    item = item_lock(item_id)
    if item.status not in {Item.Status.READY, Item.Status.FAILED}:
        raise ValidationError(
            f"An item that is {item.get_status_display().lower()} cannot be regenerated."
        )
    if item.decisions.standing().exists():
        raise ValidationError("This item already has a decision; it cannot be regenerated.")
    previous = selectors.generation_latest(item=item)
    if previous is not None and not previous.is_finished:
        raise ValidationError("Its candidates are still arriving; regenerate once they have.")
    item.status = Item.Status.GENERATING
    item.save(update_fields=["status", "updated_at"])
    count = previous.n_candidates if previous else item.queue.n_candidates
    # A captured call's served answer stays among the candidates: it is what is judged.
    served = previous.candidates.filter(served=True).first() if previous else None
    return generation_start(
        item=item, n_candidates=count, served=None if served is None else _served_of(served)
    )


@transaction.atomic
def generation_try_again(
    *, item_id: int, rewards: dict[int, float], reasons: list[str], comment: str, reviewer: str
) -> Generation:
    """A reviewer's "try again": the latest round's answers go back with their rewards (those
    not rated count as rejected, 0.0) and what the reviewer said, and a new round is
    generated with them as earlier attempts (in-context RL). The rounds stay on record."""
    item = item_lock(item_id)
    previous = selectors.generation_latest(item=item)
    if previous is None or not previous.candidates.filter(status=Candidate.Status.DONE).exists():
        raise ValidationError("There are no answers to try again from yet.")
    Generation.objects.filter(pk=previous.pk).update(
        try_again={
            "rewards": {str(candidate_id): reward for candidate_id, reward in rewards.items()},
            "reasons": reasons,
            "comment": comment,
            "reviewer": reviewer,
        }
    )
    return generation_regenerate(item_id=item_id)
