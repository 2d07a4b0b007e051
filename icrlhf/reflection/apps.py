from django.apps import AppConfig


class ReflectionConfig(AppConfig):
    name = "icrlhf.reflection"
    label = "reflection"
    verbose_name = "Reflection"
