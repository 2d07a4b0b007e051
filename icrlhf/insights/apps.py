from django.apps import AppConfig


class InsightsConfig(AppConfig):
    name = "icrlhf.insights"
    label = "insights"
