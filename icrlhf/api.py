"""The REST API (django-ninja): one router per app, mounted here under /api/v1/, with the
errors every endpoint shares (429 with Retry-After, 422 listing each invalid field)."""

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.templatetags.static import static
from django.urls import reverse
from django.utils.html import escape
from django.views.generic import RedirectView
from ninja import NinjaAPI
from ninja.errors import Throttled
from ninja.errors import ValidationError as NinjaValidationError

from icrlhf.export.api import router as export_router
from icrlhf.ingest.api import items_router
from icrlhf.ingest.api import router as tickets_router
from icrlhf.ingest.auth import TokenAuth
from icrlhf.ingest.services import CreationLimitReached
from icrlhf.trajectories.api import router as feedback_router


def _with_a_way_back(docs_view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """The API docs page (django-ninja's own) with a link back into the app on top, laid out
    for the screen it is on (ninja's page has no viewport tag: a phone drew it 980 px wide,
    shrunk) and a few styles of ours for a narrow one."""

    @wraps(docs_view)
    def view(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        response = docs_view(request, *args, **kwargs)
        if response.get("Content-Type", "").startswith("text/html"):
            head = (
                '<meta name="viewport" content="width=device-width, initial-scale=1">'
                f'<link rel="stylesheet" href="{escape(static("css/api-docs.css"))}">'
            )
            way_back = (
                f'<p class="way-back"><a href="{escape(reverse("review:queue_list"))}">'
                "&larr; Back to icrlhf</a></p>"
            )
            response.content = response.content.replace(
                b"</head>", head.encode() + b"</head>", 1
            ).replace(b'<div id="swagger-ui">', way_back.encode() + b'<div id="swagger-ui">', 1)
        return response

    return view


api = NinjaAPI(
    title="icrlhf API",
    version="1",
    description="Send items (any queue) or tickets (triage queues) in; read their candidates, "
    "decision and triage. Authenticate with `Authorization: "
    "Bearer <token>` (a token belongs to one queue; staff create them in the admin).",
    auth=TokenAuth(),
    urls_namespace="api",
    docs_decorator=_with_a_way_back,
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


@api.exception_handler(CreationLimitReached)
def creation_limit_reached(request: HttpRequest, error: CreationLimitReached) -> HttpResponse:
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


api.add_router("/", items_router)
api.add_router("/", tickets_router)
api.add_router("/", export_router)
api.add_router("/", feedback_router)


def api_urls() -> tuple[Any, str, str]:
    """The API's URL patterns, exempt from the site-wide login (the token authenticates),
    except the docs, the schema and the root (which leads to the docs), which are for
    logged-in people."""
    urls = api.urls  # a property that builds new patterns on every access: read it once
    for pattern in urls[0]:
        if getattr(pattern, "name", "") == "api-root":
            # ninja's root answers 404 ("docs_url = …"); someone who types the API's address
            # wants its docs. The name stays: ninja reverses it to build every path.
            pattern.callback = RedirectView.as_view(pattern_name="api:openapi-view")
        if getattr(pattern, "name", "") not in {"openapi-json", "openapi-view", "api-root"}:
            pattern.callback.login_required = False  # type: ignore[union-attr]
    return urls
