from django.contrib import admin
from django.urls import include, path

from icrlhf.ingest.api import api_urls

urlpatterns = [
    path("api/v1/", api_urls()),
    path("", include("icrlhf.ingest.urls")),
    path("", include("icrlhf.export.urls")),
    path("", include("icrlhf.insights.urls")),
    path("", include("icrlhf.queues.urls")),
    path("", include("icrlhf.generation.urls")),
    path("", include("icrlhf.review.urls")),
    path("accounts/", include("django.contrib.auth.urls")),
    path("admin/", admin.site.urls),
]
