from django.apps import AppConfig


class QueuesConfig(AppConfig):
    name = "icrlhf.queues"
    label = "queues"
