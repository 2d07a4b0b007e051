from django.conf import settings
from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_not_required
from django.urls import include, path
from django.views.generic import RedirectView

from icrlhf.accounts.views import RateLimitedLoginView
from icrlhf.api import api_urls

urlpatterns = [
    path("api/v1/", api_urls()),
    path("", include("icrlhf.ingest.urls")),
    path("", include("icrlhf.export.urls")),
    path("", include("icrlhf.insights.urls")),
    path("", include("icrlhf.gateway.routing_urls")),
    path("", include("icrlhf.trajectories.urls")),
    path("", include("icrlhf.playbook.urls")),
    path("", include("icrlhf.reflection.urls")),
    path("", include("icrlhf.review.urls")),
    path("", include("icrlhf.help.urls")),
    # Login, logout and password change only: no self-service reset by e-mail (an admin
    # resets passwords; a self-hosted install may have no mail server).
    path("accounts/login/", RateLimitedLoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path(
        "accounts/password_change/",
        auth_views.PasswordChangeView.as_view(),
        name="password_change",
    ),
    path(
        "accounts/password_change/done/",
        auth_views.PasswordChangeDoneView.as_view(),
        name="password_change_done",
    ),
    # The admin logs in through the rate-limited login page too.
    path(
        "admin/login/",
        login_not_required(RedirectView.as_view(pattern_name="login", query_string=True)),
    ),
    path("admin/", admin.site.urls),
    # Browsers and tools ask for /favicon.ico whatever the page says.
    path(
        "favicon.ico",
        login_not_required(
            RedirectView.as_view(url=f"{settings.STATIC_URL}favicon.svg", permanent=True)
        ),
    ),
]
