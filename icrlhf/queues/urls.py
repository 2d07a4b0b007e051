from django.urls import path

from icrlhf.queues import views

app_name = "queues"
urlpatterns = [
    path("", views.queue_list, name="list"),
    path("q/<slug:slug>/", views.queue_detail, name="detail"),
]
