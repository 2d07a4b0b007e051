from django.apps import AppConfig


class GenerationConfig(AppConfig):
    name = "icrlhf.generation"
    label = "generation"
