"""The REST API (django-ninja): token-authenticated ticket ingestion, with OpenAPI docs."""

import logging
from datetime import datetime
from typing import Any, Literal

from django.conf import settings
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import transaction
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.http.response import HttpResponseBase
from ninja import NinjaAPI, Status
from ninja.errors import Throttled
from ninja.errors import ValidationError as NinjaValidationError
from ninja.security import HttpBearer

from icrlhf.accounts.ratelimit import attempt_allowed, client_ip, seconds_left_in_window
from icrlhf.export.services import ExportFilters, export_lines
from icrlhf.ingest.models import IntegrationToken
from icrlhf.ingest.schemas import BatchIn, ErrorOut, TicketIn, TicketOut
from icrlhf.ingest.services import token_authenticate
from icrlhf.queues.models import Item
from icrlhf.triage.services import ticket_create

logger = logging.getLogger(__name__)


class TokenAuth(HttpBearer):
    def authenticate(self, request: HttpRequest, token: str) -> IntegrationToken | None:
        record = token_authenticate(token=token)
        # Both limits count with the cache's atomic increment, so calls in parallel cannot
        # slip past them (a read-then-write history, as ninja's throttles keep, can).
        if record is None:
            scope, ident = "api-auth-failure", client_ip(request)  # someone guessing tokens
        else:
            scope, ident = "api-token", str(record.pk)
        if not attempt_allowed(scope, ident, per_minute=settings.API_REQUESTS_PER_MINUTE):
            raise Throttled(wait=seconds_left_in_window())
        return record


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


api = NinjaAPI(
    title="icrlhf API",
    version="1",
    description="Send tickets in; read their triage. Authenticate with `Authorization: "
    "Bearer <token>` (a token belongs to one queue; staff create them in the admin).",
    auth=TokenAuth(),
    urls_namespace="api",
)


def _too_many(request: HttpRequest, detail: str, wait: int) -> HttpResponse:
    response = api.create_response(
        request, {"detail": f"{detail} Nothing was saved.", "errors": []}, status=429
    )
    response["Retry-After"] = str(wait)
    return response


@api.exception_handler(Throttled)
def throttled(request: HttpRequest, error: Throttled) -> HttpResponse:
    wait = error.wait or 60
    return _too_many(request, f"Too many requests; retry in {wait} s.", wait)


@api.exception_handler(TicketLimitReached)
def ticket_limit_reached(request: HttpRequest, error: TicketLimitReached) -> HttpResponse:
    return _too_many(request, str(error), error.wait)


@api.exception_handler(NinjaValidationError)
def validation_failed(request: HttpRequest, error: NinjaValidationError) -> HttpResponse:
    problems = [
        {"field": _field_path(problem.get("loc", ())), "message": str(problem.get("msg"))}
        for problem in error.errors
    ]
    return api.create_response(
        request,
        {"detail": "The request is invalid; nothing was saved.", "errors": problems},
        status=422,
    )


def _field_path(location: Any) -> str:
    """ninja locates a body field as ("body", "payload", "subject"): keep "subject"."""
    parts = [str(part) for part in location]
    for prefix in ("body", "payload"):
        if parts[:1] == [prefix]:
            parts = parts[1:]
    return ".".join(parts) or "body"


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


@api.post(
    "/tickets",
    response={201: TicketOut, 200: TicketOut, 415: ErrorOut, 422: ErrorOut, 429: ErrorOut},
    summary="Create a ticket (idempotent on external_id)",
)
def ticket_post(request: HttpRequest, payload: TicketIn) -> Status[object]:
    token: IntegrationToken = request.auth  # type: ignore[attr-defined]
    if (wrong_type := _not_json(request)) is not None:
        return wrong_type
    _creation_check(token, 1)
    try:
        item, created = _create(token, payload)
    except DjangoValidationError as error:
        return Status(422, {"detail": " ".join(error.messages), "errors": []})
    return Status(201 if created else 200, _out(item, created=created))


@api.post(
    "/tickets/batch",
    response={201: list[TicketOut], 415: ErrorOut, 422: ErrorOut, 429: ErrorOut},
    summary="Create up to 100 tickets: all or none",
)
def tickets_batch(request: HttpRequest, payload: BatchIn) -> Status[object]:
    token: IntegrationToken = request.auth  # type: ignore[attr-defined]
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


@api.get("/tickets/{ticket_id}", response={200: TicketOut, 404: ErrorOut}, summary="Read a ticket")
def ticket_get(request: HttpRequest, ticket_id: int) -> Status[object]:
    token: IntegrationToken = request.auth  # type: ignore[attr-defined]
    item = Item.objects.filter(queue=token.queue, pk=ticket_id).first()
    if item is None:
        return Status(404, {"detail": "No such ticket in this token's queue.", "errors": []})
    return Status(200, _out(item, created=False))


@api.get(
    "/exports/preferences",
    summary="Export this queue's decisions as JSON lines (streamed)",
    response={200: None, 422: ErrorOut},
)
def preferences_export(
    request: HttpRequest,
    format: Literal["canonical", "trl", "openai", "kto"] = "canonical",  # noqa: A002
    decided_from: datetime | None = None,
    decided_to: datetime | None = None,
    reviewer: str = "",
    verdict: Literal["", "chosen", "edited", "none_acceptable"] = "",
    since_last_export: bool = False,
    anonymize: bool = False,
) -> HttpResponseBase:
    token: IntegrationToken = request.auth  # type: ignore[attr-defined]
    filters = ExportFilters(
        queue=token.queue,
        decided_from=decided_from,
        decided_to=decided_to,
        reviewer=reviewer,
        verdict=verdict,
        since_last_export=since_last_export,
        anonymize=anonymize,
    )
    lines = export_lines(fmt=format, filters=filters, consumer=f"token:{token.pk}")
    return StreamingHttpResponse(lines, content_type="application/x-ndjson")


def api_urls() -> tuple[Any, str, str]:
    """The API's URL patterns, exempt from the site-wide login (the token authenticates),
    except the docs and the schema, which are for logged-in people."""
    urls = api.urls  # a property that builds new patterns on every access: read it once
    for pattern in urls[0]:
        if getattr(pattern, "name", "") not in {"openapi-json", "openapi-view"}:
            pattern.callback.login_required = False  # type: ignore[union-attr]
    return urls
