from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "icrlhf.accounts"
    label = "accounts"
