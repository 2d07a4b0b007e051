from django.apps import AppConfig


class ExportConfig(AppConfig):
    name = "icrlhf.export"
    label = "export"
