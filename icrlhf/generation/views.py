from django.contrib import messages
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.views.decorators.http import require_POST

from icrlhf.generation.models import Candidate
from icrlhf.queues.access import queue_for_member, review_check
from icrlhf.queues.models import Item
from icrlhf.review import services


@require_POST
def candidate_retry(request: HttpRequest, candidate_id: int) -> HttpResponse:
    candidate = get_object_or_404(
        Candidate.objects.select_related("generation__item__queue"), pk=candidate_id
    )
    item = candidate.generation.item
    review_check(request.user, queue_for_member(request.user, pk=item.queue_id))
    try:
        services.candidate_retry(
            candidate_id=candidate.pk,
            reviewer=request.user,  # type: ignore[arg-type]  # login is required
        )
    except services.DecisionConflict as error:
        messages.error(request, str(error))
    except ValidationError as error:
        messages.error(request, " ".join(error.messages))
    else:
        messages.info(request, f"Retrying candidate {candidate.label}.")
    return redirect("review:item", item_id=item.pk)


@require_POST
def item_regenerate(request: HttpRequest, item_id: int) -> HttpResponse:
    item = get_object_or_404(Item, pk=item_id)
    review_check(request.user, queue_for_member(request.user, pk=item.queue_id))
    try:
        services.item_regenerate(
            item_id=item.pk,
            reviewer=request.user,  # type: ignore[arg-type]  # login is required
        )
    except services.DecisionConflict as error:
        messages.error(request, str(error))
    except ValidationError as error:
        messages.error(request, " ".join(error.messages))
    else:
        messages.info(request, "Generating a new set of candidates.")
    return redirect("review:item", item_id=item.pk)
