"""The tickets' API: send tickets in (one or a batch), read their triage. Mounted by
icrlhf/api.py."""

import logging

from django.conf import settings
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import transaction
from django.http import HttpRequest
from ninja import Router, Status

from icrlhf.accounts.ratelimit import attempt_allowed, seconds_left_in_window
from icrlhf.ingest.auth import token_of
from icrlhf.ingest.models import IntegrationToken
from icrlhf.ingest.schemas import BatchIn, ErrorOut, TicketIn, TicketOut
from icrlhf.queues.models import Item
from icrlhf.triage.services import ticket_create

logger = logging.getLogger(__name__)
router = Router(tags=["tickets"])


class TicketLimitReached(Exception):
    def __init__(self, limit: int, wait: int) -> None:
        super().__init__(f"This token may create {limit:,} tickets a minute; retry in {wait} s.")
        self.wait = wait


def _creation_check(token: IntegrationToken, count: int) -> None:
    """The token's ticket limit (a batch counts each ticket): one integration's flood is
    refused with a clear 429, whole batches only, so nothing is half saved."""
    limit = settings.TICKETS_PER_MINUTE_PER_TOKEN
    if not attempt_allowed("api-token-tickets", str(token.pk), per_minute=limit, cost=count):
        raise TicketLimitReached(limit, seconds_left_in_window())


def _out(item: Item, *, created: bool) -> TicketOut:
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


def _not_json(request: HttpRequest) -> Status[object] | None:
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
    if (wrong_type := _not_json(request)) is not None:
        return wrong_type
    _creation_check(token, 1)
    try:
        item, created = _create(token, payload)
    except DjangoValidationError as error:
        return Status(422, {"detail": " ".join(error.messages), "errors": []})
    return Status(201 if created else 200, _out(item, created=created))


@router.post(
    "/tickets/batch",
    response={201: list[TicketOut], 415: ErrorOut, 422: ErrorOut, 429: ErrorOut},
    summary="Create up to 100 tickets: all or none",
)
def tickets_batch(request: HttpRequest, payload: BatchIn) -> Status[object]:
    token = token_of(request)
    if (wrong_type := _not_json(request)) is not None:
        return wrong_type
    _creation_check(token, len(payload.tickets))
    results: list[TicketOut] = []
    try:
        with transaction.atomic():
            for index, ticket in enumerate(payload.tickets):
                try:
                    item, created = _create(token, ticket)
                except DjangoValidationError as error:
                    raise _BatchRefused(index, " ".join(error.messages)) from error
                results.append(_out(item, created=created))
    except _BatchRefused as refused:
        return Status(
            422,
            {
                "detail": "The batch is invalid; nothing was saved.",
                "errors": [{"field": f"tickets.{refused.index}", "message": refused.message}],
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
    return Status(200, _out(item, created=False))
