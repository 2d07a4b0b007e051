from django.urls import path

from icrlhf.ingest import views

app_name = "ingest"
urlpatterns = [
    path("q/<slug:slug>/import/", views.ticket_import, name="import"),
]
