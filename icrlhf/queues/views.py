from django import forms
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render

from icrlhf.queues.access import (
    can_curate,
    can_review,
    queue_for_member,
    queues_visible,
    review_check,
)
from icrlhf.queues.forms import ItemCreateForm
from icrlhf.queues.models import Item, Queue
from icrlhf.queues.selectors import queue_items_recent, queues_with_counts
from icrlhf.queues.services import item_create
from icrlhf.triage.services import ticket_create
from icrlhf.triage.views import TicketCreateForm, TicketFilterForm, tickets_for_queue


def queue_list(request: HttpRequest) -> HttpResponse:
    queues = queues_with_counts(queues=queues_visible(request.user))
    return render(request, "queues/list.html", {"queues": queues})


def queue_detail(request: HttpRequest, slug: str) -> HttpResponse:
    queue = queue_for_member(request.user, slug=slug)
    triage = queue.kind == Queue.Kind.TRIAGE
    form: forms.Form = (TicketCreateForm if triage else ItemCreateForm)(request.POST or None)
    if request.method == "POST":
        review_check(request.user, queue)
    if request.method == "POST" and form.is_valid():
        try:
            if triage:
                item, _created = ticket_create(
                    queue=queue, source=Item.Source.UI, **form.cleaned_data
                )
            else:
                item = item_create(
                    queue=queue,
                    input_text=form.cleaned_data["input_text"],
                    n_candidates=form.cleaned_data["n_candidates"],
                    created_by=request.user,  # type: ignore[arg-type]
                )
        except ValidationError as error:  # what the services refuse (e.g. a too long input)
            form.add_error(None, error)
        else:
            return redirect("review:item", item_id=item.pk)
    status = 400 if form.errors else 200
    context = {
        "queue": queue,
        "form": form,
        "can_review": can_review(request.user, queue),
        "can_curate": can_curate(request.user),
    }
    if queue.kind == Queue.Kind.TRIAGE:
        filters = TicketFilterForm(request.GET or None, queue=queue)
        context["filters"] = filters
        context["tickets"] = tickets_for_queue(queue=queue, filters=filters)
    else:
        context["items"] = queue_items_recent(queue=queue)
    return render(request, "queues/detail.html", context, status=status)
