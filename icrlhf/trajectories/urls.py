from django.urls import path

from icrlhf.trajectories import views

app_name = "trajectories"
urlpatterns = [
    path("q/<slug:slug>/trajectories/", views.trajectory_list, name="list"),
    path(
        "q/<slug:slug>/trajectories/<uuid:trajectory_id>/",
        views.trajectory_detail,
        name="detail",
    ),
    path(
        "q/<slug:slug>/trajectories/<uuid:trajectory_id>/approval",
        views.trajectory_approval,
        name="approval",
    ),
    path(
        "q/<slug:slug>/trajectories/<uuid:trajectory_id>/outcome",
        views.trajectory_outcome,
        name="outcome",
    ),
]
