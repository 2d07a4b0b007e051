from django.apps import AppConfig


class IngestConfig(AppConfig):
    name = "icrlhf.ingest"
    label = "ingest"
