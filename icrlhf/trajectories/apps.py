from django.apps import AppConfig


class TrajectoriesConfig(AppConfig):
    name = "icrlhf.trajectories"
    label = "trajectories"
