from django.apps import AppConfig


class GatewayConfig(AppConfig):
    name = "icrlhf.gateway"
    default_auto_field = "django.db.models.BigAutoField"
