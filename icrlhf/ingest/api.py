"""The REST API (django-ninja): token-authenticated ticket ingestion, with OpenAPI docs."""

from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import transaction
from django.http import HttpRequest, HttpResponse
from ninja import NinjaAPI
from ninja.errors import ValidationError as NinjaValidationError
from ninja.security import HttpBearer

from icrlhf.ingest.models import IntegrationToken
from icrlhf.ingest.schemas import BatchIn, ErrorOut, TicketIn, TicketOut
from icrlhf.ingest.services import token_authenticate
from icrlhf.queues.models import Item
from icrlhf.triage.services import ticket_create


class TokenAuth(HttpBearer):
    def authenticate(self, request: HttpRequest, token: str) -> IntegrationToken | None:
        return token_authenticate(token=token)


api = NinjaAPI(
    title="icrlhf API",
    version="1",
    description="Send tickets in; read their triage. Authenticate with `Authorization: "
    "Bearer <token>` (a token belongs to one queue; staff create them in the admin).",
    auth=TokenAuth(),
    urls_namespace="api",
)


@api.exception_handler(NinjaValidationError)
def validation_failed(request: HttpRequest, error: NinjaValidationError) -> HttpResponse:
    problems = [
        {
            "field": ".".join(str(part) for part in problem.get("loc", ()) if part != "payload"),
            "message": str(problem.get("msg", "invalid")),
        }
        for problem in error.errors
    ]
    return api.create_response(
        request,
        {"detail": "The request is invalid; nothing was saved.", "errors": problems},
        status=422,
    )


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


def _create(token: IntegrationToken, ticket: TicketIn) -> tuple[Item, bool]:
    return ticket_create(queue=token.queue, source=Item.Source.API, **ticket.dict())


@api.post(
    "/tickets",
    response={201: TicketOut, 200: TicketOut, 422: ErrorOut},
    summary="Create a ticket (idempotent on external_id)",
)
def ticket_post(
    request: HttpRequest, payload: TicketIn
) -> tuple[int, TicketOut | dict[str, object]]:
    token: IntegrationToken = request.auth  # type: ignore[attr-defined]
    try:
        item, created = _create(token, payload)
    except DjangoValidationError as error:
        return 422, {"detail": " ".join(error.messages), "errors": []}
    return (201 if created else 200), _out(item, created=created)


@api.post(
    "/tickets/batch",
    response={201: list[TicketOut], 422: ErrorOut},
    summary="Create up to 100 tickets: all or none",
)
def tickets_batch(request: HttpRequest, payload: BatchIn) -> tuple[int, object]:
    token: IntegrationToken = request.auth  # type: ignore[attr-defined]
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
        return 422, {
            "detail": "The batch is invalid; nothing was saved.",
            "errors": [{"field": f"tickets.{refused.index}", "message": refused.message}],
        }
    return 201, results


class _BatchRefused(Exception):
    def __init__(self, index: int, message: str) -> None:
        super().__init__(message)
        self.index, self.message = index, message


@api.get("/tickets/{ticket_id}", response={200: TicketOut, 404: ErrorOut}, summary="Read a ticket")
def ticket_get(request: HttpRequest, ticket_id: int) -> tuple[int, object]:
    token: IntegrationToken = request.auth  # type: ignore[attr-defined]
    item = Item.objects.filter(queue=token.queue, pk=ticket_id).first()
    if item is None:
        return 404, {"detail": "No such ticket in this token's queue.", "errors": []}
    return 200, _out(item, created=False)


def api_urls() -> tuple[Any, str, str]:
    """The API's URL patterns, exempt from the site-wide login (the token authenticates),
    except the docs and the schema, which are for logged-in people."""
    patterns, _app, _namespace = api.urls
    for pattern in patterns:
        if getattr(pattern, "name", "") not in {"openapi-json", "openapi-view"}:
            pattern.callback.login_required = False  # type: ignore[union-attr]
    return api.urls  # type: ignore[no-any-return]
