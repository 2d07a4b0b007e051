from django.apps import AppConfig


class ReviewConfig(AppConfig):
    name = "icrlhf.review"
    label = "review"
