import unicodedata

from django.conf import settings
from django.contrib.auth.views import LoginView
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from icrlhf.accounts.ratelimit import attempt_allowed, client_ip


class RateLimitedLoginView(LoginView):
    """Django's login, with attempts limited per client address and per user name."""

    def post(self, request: HttpRequest, *args: object, **kwargs: object) -> HttpResponse:
        limit = settings.LOGIN_ATTEMPTS_PER_MINUTE
        username = login_limit_key(str(request.POST.get("username", "")))
        by_address = attempt_allowed("login-ip", client_ip(request), per_minute=limit)
        by_user = attempt_allowed("login-user", username, per_minute=limit)
        if not (by_address and by_user):
            response = render(request, "registration/throttled.html", status=429)
            response["Retry-After"] = "60"
            return response
        return super().post(request, *args, **kwargs)


def login_limit_key(username: str) -> str:
    """The name the attempt is counted under: what Django's login form makes of it (stripped,
    NFKC-normalised, so " name", "name\t" and full-width "ｎａｍｅ" are one person), and
    case-folded, so changing case does not buy more guesses either."""
    return unicodedata.normalize("NFKC", username.strip()).casefold()[:150]
