from django.urls import path

from icrlhf.review import views

app_name = "review"
urlpatterns = [
    path("items/<int:item_id>/decide/", views.decide, name="decide"),
]
