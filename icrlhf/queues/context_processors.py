from typing import Any

from django.http import HttpRequest

from icrlhf.queues.access import curates_any


def roles(request: HttpRequest) -> dict[str, Any]:
    return {"can_curate": curates_any(request.user)}
