from django.apps import AppConfig


class BenchConfig(AppConfig):
    """The benchmarks and the fault suite: `manage.py bench_*` and `manage.py chaos`.

    Not part of the shipped package (pyproject packages icrlhf and worker only); settings add
    this app when the repository's `bench/` folder is importable."""

    name = "bench"
