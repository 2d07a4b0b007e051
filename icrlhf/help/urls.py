from django.urls import path

from icrlhf.help import views

app_name = "help"
urlpatterns = [
    path("help/", views.help_index, name="index"),
    path("help/<slug:slug>/", views.help_page, name="page"),
]
