"""Integration tokens authenticate API calls: each belongs to one queue, may call only the
scopes it was given, and is limited per minute (as is every address that guesses tokens).

One check for every API (`token_admit`), in one order: the token, then its scope, then its
limit; the REST API and the gateway each answer a refusal in their own shape."""

from dataclasses import dataclass

from django.conf import settings
from django.http import HttpRequest
from ninja.errors import HttpError, Throttled
from ninja.security import HttpBearer

from icrlhf.accounts.ratelimit import attempt_allowed, client_ip, seconds_left_in_window
from icrlhf.ingest.models import IntegrationToken, Scope
from icrlhf.ingest.services import token_authenticate


@dataclass(frozen=True)
class TokenLimit:
    """The calls a token may make a minute on one API, counted under `name`."""

    name: str
    per_minute: int


class TokenRefused(Exception):
    """Why an API call's token was refused."""


class TokenUnknown(TokenRefused):
    """No such live token (401)."""


class TokenGuessing(TokenRefused):
    """Too many unknown tokens from this address this minute (429)."""

    def __init__(self, *, retry_after_s: int) -> None:
        super().__init__("Too many failed authentications from this address.")
        self.retry_after_s = retry_after_s


class TokenScopeMissing(TokenRefused):
    """The token was not given the API's scope (403)."""

    def __init__(self, scope: str) -> None:
        super().__init__(f"This token does not have the “{scope}” scope.")


class TokenOverLimit(TokenRefused):
    """The token made its minute's calls already (429; each API says so in its own words)."""

    def __init__(self, *, retry_after_s: int) -> None:
        super().__init__("This token made its calls for this minute.")
        self.retry_after_s = retry_after_s


def token_admit(
    *, request: HttpRequest, token: str, scope: str, limit: TokenLimit
) -> IntegrationToken:
    """The token a call sent, if it may make this call; else raises a `TokenRefused`.

    Both limits count with the cache's atomic increment, so calls in parallel cannot slip
    past them (a read-then-write history, as ninja's throttles keep, can). A call refused for
    its scope is not counted against its token's limit."""
    record = token_authenticate(token=token)
    if record is None:
        # Someone guessing tokens is limited per address.
        if not attempt_allowed(
            "api-auth-failure", client_ip(request), per_minute=settings.API_REQUESTS_PER_MINUTE
        ):
            raise TokenGuessing(retry_after_s=seconds_left_in_window())
        raise TokenUnknown("No such token.")
    if not record.allows(scope):
        raise TokenScopeMissing(scope)
    if not attempt_allowed(limit.name, str(record.pk), per_minute=limit.per_minute):
        raise TokenOverLimit(retry_after_s=seconds_left_in_window())
    return record


def token_charge(*, token_id: int, limit: TokenLimit) -> bool:
    """Counts one more call of this token against its minute's `limit`: an upstream call made
    for a call already admitted (the gateway asking the model again). False, and not
    counted, when the token has made its minute's calls already."""
    return attempt_allowed(limit.name, str(token_id), per_minute=limit.per_minute)


class TokenAuth(HttpBearer):
    def __init__(self, scope: str = Scope.ITEMS) -> None:
        super().__init__()
        self.scope = scope

    def authenticate(self, request: HttpRequest, token: str) -> IntegrationToken | None:
        limit = TokenLimit("api-token", settings.API_REQUESTS_PER_MINUTE)
        try:
            return token_admit(request=request, token=token, scope=self.scope, limit=limit)
        except TokenUnknown:
            return None  # ninja answers 401
        except (TokenGuessing, TokenOverLimit) as refused:
            raise Throttled(wait=refused.retry_after_s) from refused
        except TokenScopeMissing as refused:
            raise HttpError(403, str(refused)) from refused


def token_of(request: HttpRequest) -> IntegrationToken:
    """The token an API call authenticated with (ninja sets `request.auth`)."""
    token = getattr(request, "auth", None)
    if not isinstance(token, IntegrationToken):
        raise PermissionError("The API call is not authenticated with a token.")
    return token
