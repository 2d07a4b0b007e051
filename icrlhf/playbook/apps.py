from django.apps import AppConfig


class PlaybookConfig(AppConfig):
    name = "icrlhf.playbook"
    label = "playbook"
    verbose_name = "Playbooks"
