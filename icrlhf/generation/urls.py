from django.urls import path

from icrlhf.generation import views

app_name = "generation"
urlpatterns = [
    path("candidates/<int:candidate_id>/retry/", views.candidate_retry, name="retry"),
    path("items/<int:item_id>/regenerate/", views.item_regenerate, name="regenerate"),
]
