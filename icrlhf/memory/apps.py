from django.apps import AppConfig


class MemoryConfig(AppConfig):
    name = "icrlhf.memory"
    label = "memory"
