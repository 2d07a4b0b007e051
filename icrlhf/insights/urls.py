from django.urls import path

from icrlhf.insights import views

app_name = "insights"
urlpatterns = [
    path("q/<slug:slug>/dashboard/", views.queue_dashboard_page, name="dashboard"),
    path("q/<slug:slug>/calls/", views.queue_calls_page, name="calls"),
]
