from django import forms
from django.conf import settings
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render

from icrlhf.accounts.ratelimit import attempt_allowed, seconds_left_in_window
from icrlhf.generation.services import item_create
from icrlhf.kinds import kind_of
from icrlhf.queues.access import (
    can_curate,
    can_review,
    queue_for_member,
    queues_visible,
    review_check,
)
from icrlhf.queues.forms import ItemCreateForm
from icrlhf.queues.models import Item, Queue
from icrlhf.queues.rules import rules_summary
from icrlhf.queues.selectors import queue_items_recent, queues_with_counts
from icrlhf.review.calibrations import routing_facts
from icrlhf.triage.forms import TicketCreateForm, TicketFilterForm
from icrlhf.triage.selectors import tickets_channels, tickets_for_queue
from icrlhf.triage.services import ticket_create


def queue_list(request: HttpRequest) -> HttpResponse:
    queues = queues_with_counts(queues=queues_visible(request.user))
    return render(request, "queues/list.html", {"queues": queues})


def queue_detail(request: HttpRequest, slug: str) -> HttpResponse:
    queue = queue_for_member(request.user, slug=slug)
    # The ticket flow owns how a queue of tickets has its items created and listed (its form,
    # its SLA-ordered list); other queues take a prompt.
    takes_tickets = kind_of(queue).takes_tickets
    form: forms.Form = (TicketCreateForm if takes_tickets else ItemCreateForm)(request.POST or None)
    if request.method == "POST":
        review_check(request.user, queue)
    if request.method == "POST" and form.is_valid():
        limit = settings.ITEMS_PER_MINUTE_PER_USER
        if not attempt_allowed("item-create", str(request.user.pk), per_minute=limit):
            wait = seconds_left_in_window()
            form.add_error(
                None,
                f"You have created {limit} item{'' if limit == 1 else 's'} this minute, the "
                f"most one person may; try again in {wait} s. This one was not saved.",
            )
            response = _queue_page(request, queue, form, status=429)
            response["Retry-After"] = str(wait)
            return response
        try:
            if takes_tickets:
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
    return _queue_page(request, queue, form, status=400 if form.errors else 200)


def _queue_page(
    request: HttpRequest, queue: Queue, form: forms.Form, *, status: int
) -> HttpResponse:
    context = {
        "queue": queue,
        "form": form,
        "can_review": can_review(request.user, queue),
        "can_curate": can_curate(request.user, queue),
        # The summary of its routing rules, as they act (gateway/routing_summary.html).
        "rules": rules_summary(
            queue=queue,
            evidence=routing_facts(queue).evidence,
        ),
    }
    if kind_of(queue).takes_tickets:
        filters = TicketFilterForm(
            request.GET or None, queue=queue, channels=tickets_channels(queue=queue)
        )
        context["filters"] = filters
        context["tickets"] = tickets_for_queue(queue=queue, filters=filters.chosen())
    else:
        context["items"] = queue_items_recent(queue=queue)
    return render(request, "queues/detail.html", context, status=status)
