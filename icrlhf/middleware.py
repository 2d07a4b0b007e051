"""Request checks that hold for every page and API call."""

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse, JsonResponse

NUL_MESSAGE = "Text must not contain NUL (0x00) characters; nothing was saved."


class RefuseNulCharactersMiddleware:
    """PostgreSQL cannot store a NUL character in text (SQLite can), so a NUL in a query
    string or a form field is refused here, the same way on both databases, before any view
    or query sees it. JSON bodies are checked by their schemas (`ingest.schemas`)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if _has_nul(request.GET) or (request.method == "POST" and _has_nul(request.POST)):
            if request.path.startswith("/api/"):
                return JsonResponse({"detail": NUL_MESSAGE, "errors": []}, status=400)
            return HttpResponse(NUL_MESSAGE, status=400, content_type="text/plain")
        return self.get_response(request)


def _has_nul(data: object) -> bool:
    lists = getattr(data, "lists", None)
    if lists is None:
        return False
    return any("\x00" in key or any("\x00" in v for v in values) for key, values in lists())
