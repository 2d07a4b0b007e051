"""The request a page's view gets, as the type checker should see it: every page needs a login
(LoginRequiredMiddleware), and django-htmx's middleware says whether htmx made it."""

from django.contrib.auth.models import User
from django.http import HttpRequest
from django_htmx.middleware import HtmxDetails


class PageRequest(HttpRequest):
    user: User
    htmx: HtmxDetails
