from typing import Any

from django.http import HttpRequest

from icrlhf.queues.access import can_curate


def roles(request: HttpRequest) -> dict[str, Any]:
    return {"can_curate": can_curate(request.user)}
