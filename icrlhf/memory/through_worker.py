"""Maintenance commands run in the worker: in the default set-up it alone owns the store."""

from typing import Any

from celery import Task
from celery.exceptions import TimeoutError as ResultTimeout
from django.core.management.base import CommandError


def run_in_worker(task: Task, *, timeout_s: float, **kwargs: Any) -> dict[str, Any]:
    try:
        return dict(task.apply_async(kwargs=kwargs).get(timeout=timeout_s))
    except (ResultTimeout, TimeoutError) as error:
        raise CommandError(
            f"No worker answered within {timeout_s:.0f} s: is it running (make run)?"
        ) from error
