from django.apps import AppConfig


class TriageConfig(AppConfig):
    name = "icrlhf.triage"
    label = "triage"
