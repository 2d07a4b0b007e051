import unicodedata

from django.conf import settings
from django.contrib.auth.views import LoginView
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from icrlhf.accounts.ratelimit import LimiterUnavailable, attempt_allowed, client_ip


class RateLimitedLoginView(LoginView):
    """Django's login, with attempts limited per client address, and per user name from
    that address: guessing from one place cannot lock the name out everywhere else."""

    def post(self, request: HttpRequest, *args: object, **kwargs: object) -> HttpResponse:
        address = client_ip(request)
        username = login_limit_key(str(request.POST.get("username", "")))
        try:
            allowed = attempt_allowed(
                "login-ip",
                address,
                per_minute=settings.LOGIN_ATTEMPTS_PER_ADDRESS_PER_MINUTE,
                fail_closed=True,
            ) and attempt_allowed(
                "login-user",
                f"{address}:{username}",
                per_minute=settings.LOGIN_ATTEMPTS_PER_MINUTE,
                fail_closed=True,
            )
        except LimiterUnavailable:  # no counting, no guessing: closed until the cache is back
            response = render(request, "registration/throttled.html", {"down": True}, status=503)
            response["Retry-After"] = "30"
            return response
        if not allowed:
            response = render(request, "registration/throttled.html", status=429)
            response["Retry-After"] = "60"
            return response
        return super().post(request, *args, **kwargs)


def login_limit_key(username: str) -> str:
    """The name the attempt is counted under: what Django's login form makes of it (stripped,
    NFKC-normalised, so " name", "name\t" and full-width "ｎａｍｅ" are one person), and
    case-folded, so changing case does not buy more guesses either."""
    return unicodedata.normalize("NFKC", username.strip()).casefold()[:150]
