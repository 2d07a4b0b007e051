"""The curators' page of reflection's proposals: start one, decide each change, apply."""

from dataclasses import dataclass
from typing import Any

from django.contrib import messages
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from icrlhf.accounts.requests import PageRequest
from icrlhf.playbook.models import Entry
from icrlhf.playbook.selectors import current_version, version_entries
from icrlhf.queues.access import queue_for_curator
from icrlhf.reflection import services, tasks
from icrlhf.reflection.models import Mutation, Proposal
from icrlhf.review.models import Decision

PROPOSALS_SHOWN = 10


@dataclass(frozen=True)
class MutationShown:
    mutation: Mutation
    before: Entry | None  # the rule it edits, as in force now
    cited: list[tuple[int, int | None]]  # (decision, its item) for each decision it cites
    cited_runs: list[str]  # the runs it cites (ids)


@dataclass(frozen=True)
class ProposalShown:
    proposal: Proposal
    read: list[tuple[int, int | None]]  # (decision, its item) for each decision read
    mutations: list[MutationShown]


_REFUSAL = "Only the queue's curators and admins see and decide proposals."


def proposals_page(request: HttpRequest, slug: str) -> HttpResponse:
    queue = queue_for_curator(request.user, refusal=_REFUSAL, slug=slug)
    proposals = list(
        Proposal.objects.filter(queue=queue)
        .select_related("based_on", "made", "decided_by")
        .prefetch_related("mutations")[:PROPOSALS_SHOWN]
    )
    named = {
        pk
        for proposal in proposals
        for pk in [*proposal.decisions, *(c for m in proposal.mutations.all() for c in m.cites)]
    }
    in_force = {e.key: e for e in version_entries(current_version(queue))}
    # Where each decision a proposal names can be read: its item.
    items = dict(
        Decision.objects.filter(pk__in=named, item__queue=queue).values_list("pk", "item_id")
    )
    context: dict[str, Any] = {
        "queue": queue,
        "proposals": [
            ProposalShown(
                proposal=p,
                read=[(pk, items.get(pk)) for pk in p.decisions],
                mutations=[
                    MutationShown(
                        mutation=m,
                        before=in_force.get(m.key) if m.key is not None else None,
                        cited=[(pk, items.get(pk)) for pk in m.cites],
                        cited_runs=m.cites_runs,
                    )
                    for m in p.mutations.all()
                ],
            )
            for p in proposals
        ],
        "running": any(p.status == Proposal.Status.RUNNING for p in proposals),
    }
    return render(request, "reflection/proposals.html", context)


@require_POST
def reflect(request: PageRequest, slug: str) -> HttpResponse:
    queue = queue_for_curator(request.user, refusal=_REFUSAL, slug=slug)
    try:
        proposal = services.proposal_start(queue_id=queue.pk)
    except ValidationError as error:
        messages.info(request, " ".join(error.messages))
    else:
        tasks.proposal_reflect.delay(proposal.pk)
        read = f"{len(proposal.decisions)} decisions" + (
            f" and {len(proposal.runs)} agent runs" if proposal.runs else ""
        )
        messages.success(
            request,
            f"Reflecting on {read}; the proposal appears here when the model has answered.",
        )
    return redirect("reflection:proposals", slug=queue.slug)


@require_POST
def mutation_decide(request: PageRequest, slug: str, mutation_id: int) -> HttpResponse:
    queue = queue_for_curator(request.user, refusal=_REFUSAL, slug=slug)
    verdict = request.POST.get("verdict")
    if verdict not in ("approve", "reject"):
        messages.error(request, "Approve or reject the change.")
        return redirect("reflection:proposals", slug=queue.slug)
    try:
        services.mutation_decide(
            queue=queue,
            mutation_id=mutation_id,
            approve=verdict == "approve",
            actor=request.user,
            section=request.POST.get("section", ""),
            text=request.POST.get("text", ""),
        )
    except ValidationError as error:
        messages.error(request, " ".join(error.messages))
    return redirect(f"{reverse('reflection:proposals', args=[queue.slug])}#change-{mutation_id}")


@require_POST
def proposal_apply(request: PageRequest, slug: str, proposal_id: int) -> HttpResponse:
    queue = queue_for_curator(request.user, refusal=_REFUSAL, slug=slug)
    try:
        made = services.proposal_apply(queue=queue, proposal_id=proposal_id, actor=request.user)
    except ValidationError as error:
        messages.error(request, " ".join(error.messages))
        return redirect("reflection:proposals", slug=queue.slug)
    if made is None:
        messages.info(request, "Every change was rejected: the playbook stays as it is.")
        return redirect("reflection:proposals", slug=queue.slug)
    messages.success(request, f"Applied as version {made.number} of the playbook.")
    return redirect("playbook:page", slug=queue.slug)
