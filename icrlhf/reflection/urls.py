from django.urls import path

from icrlhf.reflection import views

app_name = "reflection"
urlpatterns = [
    path("q/<slug:slug>/playbook/proposals/", views.proposals_page, name="proposals"),
    path("q/<slug:slug>/playbook/reflect/", views.reflect, name="reflect"),
    path(
        "q/<slug:slug>/playbook/changes/<int:mutation_id>/",
        views.mutation_decide,
        name="mutation_decide",
    ),
    path(
        "q/<slug:slug>/playbook/proposals/<int:proposal_id>/apply/",
        views.proposal_apply,
        name="proposal_apply",
    ),
]
