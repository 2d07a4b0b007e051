"""The web app's side of the gateway: a queue's routing rules, which curators edit."""

import copy

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from icrlhf.gateway.forms import RoutingForm
from icrlhf.queues.access import can_curate, queue_for_member
from icrlhf.queues.models import Queue
from icrlhf.queues.rules import rules_summary
from icrlhf.queues.services import routing_update
from icrlhf.review import guard
from icrlhf.review.calibrations import routing_facts


def routing_page(request: HttpRequest, slug: str) -> HttpResponse:
    queue = queue_for_member(request.user, slug=slug)
    may_edit = can_curate(request.user, queue)
    facts = routing_facts(queue)
    evidence = facts.evidence
    # The form validates into a copy: a refused form leaves the page (the summary, the
    # audits' watch, the current threshold) describing the rules as saved.
    form = RoutingForm(request.POST or None, instance=copy.copy(queue), evidence=evidence)
    if request.method == "POST":
        if not may_edit:
            raise PermissionDenied("Only the queue's curators and admins change its routing.")
        if form.is_valid():
            routing_update(
                queue_id=queue.pk,
                values=form.cleaned_data,
                actor=request.user,  # type: ignore[arg-type]
            )
            messages.success(request, "Routing rules saved; the next gateway call follows them.")
            return redirect("gateway_web:routing", slug=queue.slug)
    context = {
        "queue": queue,
        "form": form,
        "may_edit": may_edit,
        "changes": [
            (change, [(_label(name), old, new) for name, (old, new) in change.changes.items()])
            for change in queue.routing_changes.select_related("changed_by")[:20]
        ],
        "rules": rules_summary(queue=queue, evidence=evidence),
        "evidence": evidence,
        "calibration": facts.calibration,
        "watch": guard.watch(queue),
        "pause": facts.pause,
    }
    return render(request, "gateway/routing.html", context, status=400 if form.errors else 200)


@require_POST
def automation_resume(request: HttpRequest, slug: str) -> HttpResponse:
    """A curator starts automation again after its audits paused it."""
    queue = queue_for_member(request.user, slug=slug)
    if not can_curate(request.user, queue):
        raise PermissionDenied("Only the queue's curators and admins resume automation.")
    if guard.automation_resume(queue=queue, actor=request.user) is None:  # type: ignore[arg-type]
        messages.info(request, "Automation was not paused.")
    else:
        messages.success(
            request, "Automation resumed: its audits are watched afresh from this moment."
        )
    return redirect(f"{reverse('gateway_web:routing', args=[queue.slug])}#automation")


def _label(name: str) -> str:
    field = Queue._meta.get_field(name)
    return str(getattr(field, "verbose_name", name))
