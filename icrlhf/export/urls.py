from django.urls import path

from icrlhf.export import views

app_name = "export"
urlpatterns = [
    path("export/", views.export_page, name="page"),
    path("export/trajectories/", views.trajectory_export_page, name="trajectories"),
]
