from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("", include("icrlhf.queues.urls")),
    path("", include("icrlhf.generation.urls")),
    path("", include("icrlhf.review.urls")),
    path("accounts/", include("django.contrib.auth.urls")),
    path("admin/", admin.site.urls),
]
