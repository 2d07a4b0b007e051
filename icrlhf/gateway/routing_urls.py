"""The web app's URLs for the gateway (the gateway process has its own: urls.py)."""

from django.urls import path

from icrlhf.gateway import routing_views

app_name = "gateway_web"
urlpatterns = [
    path("q/<slug:slug>/routing/", routing_views.routing_page, name="routing"),
    path(
        "q/<slug:slug>/routing/resume-automation/",
        routing_views.automation_resume,
        name="automation_resume",
    ),
]
