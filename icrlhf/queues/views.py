from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render

from icrlhf.queues.forms import ItemCreateForm
from icrlhf.queues.models import Queue
from icrlhf.queues.selectors import queue_items_recent, queues_with_counts
from icrlhf.queues.services import item_create


def queue_list(request: HttpRequest) -> HttpResponse:
    return render(request, "queues/list.html", {"queues": queues_with_counts()})


def queue_detail(request: HttpRequest, slug: str) -> HttpResponse:
    queue = get_object_or_404(Queue, slug=slug)
    form = ItemCreateForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        item = item_create(
            queue=queue,
            input_text=form.cleaned_data["input_text"],
            n_candidates=form.cleaned_data["n_candidates"],
            created_by=request.user,  # type: ignore[arg-type]
        )
        return redirect("generation:item", item_id=item.pk)
    status = 400 if form.errors else 200
    context = {"queue": queue, "form": form, "items": queue_items_recent(queue=queue)}
    return render(request, "queues/detail.html", context, status=status)
