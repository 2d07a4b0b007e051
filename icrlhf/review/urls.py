from django.urls import path

from icrlhf.review import queue_views, views

app_name = "review"
urlpatterns = [
    path("", queue_views.queue_list, name="queue_list"),
    path("q/<slug:slug>/", queue_views.queue_detail, name="queue_detail"),
    path("q/<slug:slug>/review/", views.queue_review, name="queue"),
    path("q/<slug:slug>/review/next/", views.next_item, name="next"),
    path("items/<int:item_id>/", views.item_detail, name="item"),
    path("items/<int:item_id>/claim/", views.claim_renew, name="claim"),
    path("items/<int:item_id>/decide/", views.decide, name="decide"),
    path("items/<int:item_id>/skip/", views.skip, name="skip"),
    path("decisions/<int:decision_id>/undo/", views.undo, name="undo"),
    path("automations/<int:automation_id>/undo/", views.automation_undo, name="automation_undo"),
    path("items/<int:item_id>/regenerate/", views.item_regenerate, name="item_regenerate"),
    path("items/<int:item_id>/try-again/", views.item_try_again, name="item_try_again"),
    path("candidates/<int:candidate_id>/retry/", views.candidate_retry, name="candidate_retry"),
]
