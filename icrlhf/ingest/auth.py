"""Integration tokens authenticate API calls: each belongs to one queue, may call only the
scopes it was given, and is limited per minute (as is every address that guesses tokens)."""

from django.conf import settings
from django.http import HttpRequest
from ninja.errors import HttpError, Throttled
from ninja.security import HttpBearer

from icrlhf.accounts.ratelimit import attempt_allowed, client_ip, seconds_left_in_window
from icrlhf.ingest.models import IntegrationToken, Scope
from icrlhf.ingest.services import token_authenticate


class TokenAuth(HttpBearer):
    def __init__(self, scope: str = Scope.ITEMS) -> None:
        super().__init__()
        self.scope = scope

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
        if record is not None and not record.allows(self.scope):
            raise HttpError(403, f"This token does not have the “{self.scope}” scope.")
        return record


def token_of(request: HttpRequest) -> IntegrationToken:
    """The token an API call authenticated with (ninja sets `request.auth`)."""
    token = getattr(request, "auth", None)
    if not isinstance(token, IntegrationToken):
        raise PermissionError("The API call is not authenticated with a token.")
    return token
