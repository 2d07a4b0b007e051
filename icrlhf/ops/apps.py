from django.apps import AppConfig


class OpsConfig(AppConfig):
    name = "icrlhf.ops"
    label = "ops"
