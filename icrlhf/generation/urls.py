from django.urls import path

from icrlhf.generation import views

app_name = "generation"
urlpatterns = [
    path("items/<int:item_id>/", views.item_detail, name="item"),
]
