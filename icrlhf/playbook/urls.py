from django.urls import path

from icrlhf.playbook import views

app_name = "playbook"
urlpatterns = [
    path("q/<slug:slug>/playbook/", views.playbook_page, name="page"),
    path("q/<slug:slug>/playbook/entries/", views.entry_add, name="entry_add"),
    path("q/<slug:slug>/playbook/entries/<int:key>/", views.entry_edit, name="entry_edit"),
    path(
        "q/<slug:slug>/playbook/entries/<int:key>/retire/",
        views.entry_retire,
        name="entry_retire",
    ),
    path(
        "q/<slug:slug>/playbook/versions/<int:number>/restore/",
        views.version_restore,
        name="version_restore",
    ),
    path("q/<slug:slug>/playbook/export.json", views.playbook_export, name="export"),
    path("q/<slug:slug>/playbook/import/", views.playbook_import, name="import"),
]
