"""The gateway process's URLs: the OpenAI-compatible API, and a health check."""

from django.urls import path

from icrlhf.gateway import views

urlpatterns = [
    path("v1/chat/completions", views.chat_completions, name="gateway_chat_completions"),
    path("v1/models", views.models, name="gateway_models"),
    path("v1/models/<str:model>", views.models, name="gateway_model"),
    path("healthz", views.health, name="gateway_health"),
]

handler404 = "icrlhf.gateway.views.not_found"
handler500 = "icrlhf.gateway.views.server_error"
