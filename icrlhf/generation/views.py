import time
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render
from django_htmx.http import HttpResponseStopPolling
from django_htmx.middleware import HtmxDetails

from icrlhf.generation import selectors
from icrlhf.queues.models import Item
from icrlhf.review.selectors import decision_latest


class HtmxHttpRequest(HttpRequest):
    htmx: HtmxDetails


def item_detail(request: HtmxHttpRequest, item_id: int) -> HttpResponse:
    """The item page; for htmx polls, only its candidates partial (polling stops when done)."""
    item = get_object_or_404(Item.objects.select_related("queue"), pk=item_id)
    generation = selectors.generation_latest(item=item)
    context: dict[str, Any] = {
        "item": item,
        "generation": generation,
        "candidates": selectors.generation_candidates(generation=generation) if generation else [],
        "progress": selectors.generation_progress(generation=generation) if generation else None,
        "retrievals": selectors.generation_retrievals(generation=generation) if generation else [],
        "decision": decision_latest(item=item),
        "shown_at_ms": int(time.time() * 1000),
    }
    if not request.htmx:
        return render(request, "generation/item.html", context)
    response = render(request, "generation/item.html#live", context)
    if generation is None or generation.is_finished:
        return HttpResponseStopPolling(response.content)
    return response
