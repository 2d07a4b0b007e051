import time

from django.contrib import messages
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.views.decorators.http import require_POST

from icrlhf.queues.models import Item
from icrlhf.review.forms import DecisionForm
from icrlhf.review.services import DecisionConflict, decision_record

# A decision said to take longer than a day comes from a stale page: its time is not recorded.
_MAX_DECIDE_MS = 24 * 3600 * 1000


@require_POST
def decide(request: HttpRequest, item_id: int) -> HttpResponse:
    item = get_object_or_404(Item, pk=item_id)
    form = DecisionForm(request.POST)
    if not form.is_valid():
        messages.error(request, "The decision was incomplete; nothing was saved. Try again.")
        return redirect("generation:item", item_id=item.pk)
    data = form.cleaned_data
    elapsed_ms = None
    if data["shown_at_ms"]:
        elapsed_ms = int(time.time() * 1000) - data["shown_at_ms"]
        elapsed_ms = elapsed_ms if 0 <= elapsed_ms <= _MAX_DECIDE_MS else None
    try:
        decision = decision_record(
            item_id=item.pk,
            reviewer=request.user,  # type: ignore[arg-type]
            verdict=data["verdict"],
            candidate_id=data["candidate"],
            final_text=data["final_text"],
            comment=data["comment"],
            time_to_decide_ms=elapsed_ms,
        )
    except ValidationError as error:
        messages.error(request, " ".join(error.messages))
    except DecisionConflict as error:
        messages.warning(request, str(error))
    else:
        messages.success(request, f"Saved: {decision.get_verdict_display().lower()}.")
    return redirect("generation:item", item_id=item.pk)
