"""The items API (any queue) and the tickets' API (triage queues): send them in, one or a
batch, idempotent on your external id; read their candidates and decision. Mounted by
icrlhf/api.py."""

import logging
from collections.abc import Callable

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import transaction
from django.http import HttpRequest
from ninja import Router, Schema, Status

from icrlhf.generation.services import item_create_once
from icrlhf.ingest.auth import token_of
from icrlhf.ingest.models import IntegrationToken
from icrlhf.ingest.schemas import (
    AutomationOut,
    BatchIn,
    CandidateOut,
    DecisionOut,
    ErrorOut,
    ItemBatchIn,
    ItemIn,
    ItemOut,
    TicketIn,
    TicketOut,
)
from icrlhf.ingest.services import token_creation_check
from icrlhf.kinds import kind_of
from icrlhf.queues.models import Item, Queue
from icrlhf.review.models import Automation, Decision
from icrlhf.review.selectors import item_outcome
from icrlhf.triage.services import ticket_create, ticket_create_from_text

logger = logging.getLogger(__name__)
router = Router(tags=["tickets"])
items_router = Router(tags=["items"])


def _creation_check(token: IntegrationToken, count: int, noun: str = "tickets") -> None:
    """Whole batches only, so nothing is half saved."""
    token_creation_check(token_id=token.pk, count=count, noun=noun)


def _out(item: Item, created: bool) -> TicketOut:
    return TicketOut(
        id=item.pk,
        external_id=item.external_id,
        subject=item.subject,
        status=item.ticket_status,
        review_status=item.status,
        category=item.category,
        priority=item.priority,
        sla_due_at=item.sla_due_at,
        triaged_at=item.triaged_at,
        created=created,
    )


def not_json(request: HttpRequest) -> Status[object] | None:
    """A body is read as JSON only when it says it is JSON (a text/plain body from a form
    on another site must not create tickets)."""
    if request.content_type == "application/json":
        return None
    return Status(
        415,
        {
            "detail": "Send the body as JSON with Content-Type: application/json; nothing "
            f"was saved (got {request.content_type or 'no content type'}).",
            "errors": [],
        },
    )


def _create(token: IntegrationToken, ticket: TicketIn) -> tuple[Item, bool]:
    return ticket_create(queue=token.queue, source=Item.Source.API, **ticket.dict())


@router.post(
    "/tickets",
    response={201: TicketOut, 200: TicketOut, 415: ErrorOut, 422: ErrorOut, 429: ErrorOut},
    summary="Create a ticket (idempotent on external_id)",
)
def ticket_post(request: HttpRequest, payload: TicketIn) -> Status[object]:
    token = token_of(request)
    if (wrong_type := not_json(request)) is not None:
        return wrong_type
    _creation_check(token, 1)
    try:
        item, created = _create(token, payload)
    except DjangoValidationError as error:
        return Status(422, {"detail": " ".join(error.messages), "errors": []})
    return Status(201 if created else 200, _out(item, created))


@router.post(
    "/tickets/batch",
    response={201: list[TicketOut], 415: ErrorOut, 422: ErrorOut, 429: ErrorOut},
    summary="Create up to 100 tickets: all or none",
)
def tickets_batch(request: HttpRequest, payload: BatchIn) -> Status[object]:
    token = token_of(request)
    if (wrong_type := not_json(request)) is not None:
        return wrong_type
    _creation_check(token, len(payload.tickets))
    return _batch("tickets", payload.tickets, lambda ticket: _out(*_create(token, ticket)))


def _batch[Entry](
    field: str, entries: list[Entry], create: Callable[[Entry], Schema]
) -> Status[object]:
    """Every entry created, or none: the first refused one is named and nothing is saved."""
    results: list[Schema] = []
    try:
        with transaction.atomic():
            for index, entry in enumerate(entries):
                try:
                    results.append(create(entry))
                except DjangoValidationError as error:
                    raise _BatchRefused(index, " ".join(error.messages)) from error
    except _BatchRefused as refused:
        return Status(
            422,
            {
                "detail": "The batch is invalid; nothing was saved.",
                "errors": [{"field": f"{field}.{refused.index}", "message": refused.message}],
            },
        )
    return Status(201, results)


class _BatchRefused(Exception):
    def __init__(self, index: int, message: str) -> None:
        super().__init__(message)
        self.index, self.message = index, message


@router.get(
    "/tickets/{ticket_id}", response={200: TicketOut, 404: ErrorOut}, summary="Read a ticket"
)
def ticket_get(request: HttpRequest, ticket_id: int) -> Status[object]:
    token = token_of(request)
    item = Item.objects.filter(queue=token.queue, pk=ticket_id).first()
    if item is None:
        return Status(404, {"detail": "No such ticket in this token's queue.", "errors": []})
    return Status(200, _out(item, False))


def _item_create(queue: Queue, item: ItemIn) -> tuple[Item, bool]:
    """Any kind of queue: one whose items are tickets files the input as a ticket."""
    if kind_of(queue).takes_tickets:
        return ticket_create_from_text(
            queue=queue,
            text=item.input,
            source=Item.Source.API,
            external_id=item.external_id,
            metadata=item.metadata,
        )
    return item_create_once(
        queue=queue,
        external_id=item.external_id,
        input_text=item.input,
        created_by=None,
        source=Item.Source.API,
        metadata=item.metadata,
    )


def _item_out(item: Item, created: bool) -> ItemOut:
    outcome = item_outcome(item=item)
    decision, automation = outcome.decision, outcome.automation
    return ItemOut(
        id=item.pk,
        external_id=item.external_id,
        source=item.source,
        status=item.status,
        input=item.input_text,
        metadata=item.metadata,
        created_at=item.created_at,
        candidates=[
            CandidateOut(
                id=c.pk,
                label=c.label,
                status=c.status,
                source=c.source,
                served=c.served,
                text=c.text,
                fields=c.fields,
                confidence=c.confidence,
            )
            for c in outcome.candidates
        ],
        decision=None
        if decision is None
        else DecisionOut(
            verdict=decision.verdict,
            candidate_id=decision.chosen_candidate_id,
            final_fields=decision.final_fields,
            decided_at=decision.created_at,
        ),
        automation=None
        if automation is None
        else AutomationOut(
            candidate_id=automation.candidate_id,
            confidence=automation.confidence,
            audit=automation.audit,
            applied_at=automation.created_at,
            undone_at=automation.undone_at,
        ),
        final_text=_final_text(item, decision, automation),
        created=created,
    )


def _final_text(item: Item, decision: Decision | None, automation: Automation | None) -> str | None:
    """The reviewers' answer; before any, what was applied without review (if not undone)."""
    kind = kind_of(item.queue)
    if decision is not None:
        if decision.verdict == decision.Verdict.NONE_ACCEPTABLE:
            return None
        return kind.example_text(text=decision.final_text, fields=decision.final_fields)
    if automation is not None and automation.standing:
        return kind.example_text(text=automation.final_text, fields=automation.final_fields)
    return None


@items_router.post(
    "/items",
    response={201: ItemOut, 200: ItemOut, 415: ErrorOut, 422: ErrorOut, 429: ErrorOut},
    summary="Create an item in the token's queue (idempotent on external_id)",
)
def item_post(request: HttpRequest, payload: ItemIn) -> Status[object]:
    token = token_of(request)
    if (wrong_type := not_json(request)) is not None:
        return wrong_type
    _creation_check(token, 1, "items")
    try:
        item, created = _item_create(token.queue, payload)
    except DjangoValidationError as error:
        return Status(422, {"detail": " ".join(error.messages), "errors": []})
    return Status(201 if created else 200, _item_out(item, created))


@items_router.post(
    "/items/batch",
    response={201: list[ItemOut], 415: ErrorOut, 422: ErrorOut, 429: ErrorOut},
    summary="Create up to 100 items: all or none",
)
def items_batch(request: HttpRequest, payload: ItemBatchIn) -> Status[object]:
    token = token_of(request)
    if (wrong_type := not_json(request)) is not None:
        return wrong_type
    _creation_check(token, len(payload.items), "items")
    return _batch(
        "items", payload.items, lambda entry: _item_out(*_item_create(token.queue, entry))
    )


@items_router.get(
    "/items/{item_id}",
    response={200: ItemOut, 404: ErrorOut},
    summary="Read an item: its status, candidates, decision and final text",
)
def item_get(request: HttpRequest, item_id: int) -> Status[object]:
    token = token_of(request)
    item = Item.objects.select_related("queue").filter(queue=token.queue, pk=item_id).first()
    if item is None:
        return Status(404, {"detail": "No such item in this token's queue.", "errors": []})
    return Status(200, _item_out(item, False))
