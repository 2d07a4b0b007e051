from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST
from django_htmx.http import HttpResponseStopPolling

from icrlhf.accounts.requests import PageRequest
from icrlhf.generation.models import Candidate
from icrlhf.kinds import kind_of
from icrlhf.playbook import selectors as playbook_selectors
from icrlhf.queues.access import queue_for_member, review_check
from icrlhf.queues.models import Item, Queue
from icrlhf.review import automation as review_automation
from icrlhf.review import claims as review_claims
from icrlhf.review import decisions as review_decisions
from icrlhf.review import selectors, tool_edits
from icrlhf.review.forms import DecisionForm, TryAgainForm
from icrlhf.review.models import Automation, Decision

# The reviewer's last decision, offered for undo until its window has passed (`_undo_offer`).
_UNDO_SESSION_KEY = "review_undo_decision"


def _item_for(request: HttpRequest, item_id: int) -> Item:
    item = get_object_or_404(Item.objects.select_related("queue"), pk=item_id)
    queue_for_member(request.user, pk=item.queue_id)
    return item


def _go_to_next(request: PageRequest, queue: Queue) -> HttpResponse:
    item = review_claims.claim_next(queue=queue, reviewer=request.user)
    if item is None:
        messages.info(request, "Nothing left to review in this queue. Well done.")
        return redirect("review:queue", slug=queue.slug)
    return redirect("review:item", item_id=item.pk)


def queue_review(request: PageRequest, slug: str) -> HttpResponse:
    queue = queue_for_member(request.user, slug=slug)
    review_check(request.user, queue)
    progress = selectors.review_progress(queue=queue, reviewer=request.user)
    skipped = list(selectors.items_skipped(queue=queue, reviewer=request.user))
    context = {
        "queue": queue,
        "kind": kind_of(queue),
        "progress": progress,
        "skipped": skipped,
        "day": selectors.review_day_summary(queue=queue, reviewer=request.user),
        **_undo_offer(request),
    }
    return render(request, "review/queue.html", context)


@require_POST
def next_item(request: PageRequest, slug: str) -> HttpResponse:
    queue = queue_for_member(request.user, slug=slug)
    review_check(request.user, queue)
    return _go_to_next(request, queue)


def item_detail(request: PageRequest, item_id: int) -> HttpResponse:
    """The workbench for one item; for htmx polls only its live part (polling stops when
    the generation is done). Opening an open item claims it for a reviewer."""
    item = _item_for(request, item_id)
    page = selectors.item_page(item=item, user=request.user, poll=bool(request.htmx))
    context = {**page.context(), **_undo_offer(request)}
    if not request.htmx:
        playbook = playbook_selectors.current_version(item.queue)
        context["playbook"] = playbook
        context["playbook_sections"] = playbook_selectors.by_section(
            playbook_selectors.version_entries(playbook)
        )
        return render(request, "review/item.html", context)
    response = render(request, "review/item.html#live", context)
    if not page.polling:
        return HttpResponseStopPolling(response.content)
    return response


def _undo_offer(request: PageRequest) -> dict[str, Any]:
    """The reviewer's last decision while it can still be undone, and until when (epoch ms),
    for the one banner that says it was saved; nothing once the window has passed."""
    decision_id = request.session.get(_UNDO_SESSION_KEY)
    decision = (
        Decision.objects.standing().filter(pk=decision_id, reviewer=request.user).first()
        if decision_id is not None
        else None
    )
    window = timedelta(seconds=settings.REVIEW_UNDO_WINDOW_S)
    if decision is None or decision.created_at + window <= timezone.now():
        request.session.pop(_UNDO_SESSION_KEY, None)
        return {}
    until_ms = int((decision.created_at + window).timestamp() * 1000)
    return {"undo": decision, "undo_until_ms": until_ms}


@require_POST
def claim_renew(request: PageRequest, item_id: int) -> HttpResponse:
    """Takes or renews the reviewer's hold on an item (the item page posts it as it loads,
    then every third of the hold's time)."""
    item = _item_for(request, item_id)
    review_check(request.user, item.queue)
    expires_at = review_claims.claim_take(item_id=item.pk, reviewer=request.user)
    return render(request, "review/_claim.html", {"expires_at": expires_at, "item": item})


def _form_problem(form: DecisionForm | TryAgainForm) -> str:
    """The real reason a decision was refused, in a sentence."""
    if "choice" in form.errors:
        return "Choose a candidate or “none acceptable”; nothing was saved."
    labels = {
        "comment": "Comment",
        "shown_at_ms": "Time shown",
        "shown_candidates": "Candidates shown",
        "__all__": "Ratings",
    }
    reasons = " ".join(
        f"{labels.get(name, name)}: {' '.join(str(error) for error in errors)}"
        for name, errors in form.errors.items()
    )
    return f"{reasons} Nothing was saved."


@require_POST
def decide(request: PageRequest, item_id: int) -> HttpResponse:
    item = _item_for(request, item_id)
    review_check(request.user, item.queue)
    form = DecisionForm(request.POST, correction_fields=kind_of(item.queue).correction_fields)
    if not form.is_valid():
        messages.error(request, _form_problem(form))
        return redirect("review:item", item_id=item.pk)
    submitted = form.decision_input()
    try:
        tool_calls = tool_edits.picked_calls_edited(
            item=item, candidate_id=submitted.candidate_id, data=request.POST
        )
        decision = review_decisions.decision_record(
            item_id=item.pk,
            reviewer=request.user,
            verdict="none_acceptable" if submitted.candidate_id is None else "chosen",
            candidate_id=submitted.candidate_id,
            final_text=submitted.final_text,
            reason_tags=submitted.reason_tags,
            comment=submitted.comment,
            time_to_decide_ms=submitted.time_to_decide_ms,
            corrections=submitted.corrections,
            shown_candidate_ids=submitted.shown_candidate_ids,
            tool_calls=tool_calls,
            ratings=submitted.ratings,
        )
    except ValidationError as error:
        messages.error(request, " ".join(error.messages))
        return redirect("review:item", item_id=item.pk)
    except review_claims.DecisionConflict as error:
        messages.warning(request, str(error))
        return redirect("review:item", item_id=item.pk)
    request.session[_UNDO_SESSION_KEY] = decision.pk
    if not settings.REVIEW_UNDO_WINDOW_S:  # otherwise the undo banner says it was saved
        messages.success(
            request, f"Saved item {item.pk}: {decision.get_verdict_display().lower()}."
        )
    return _go_to_next(request, item.queue)


@require_POST
def undo(request: PageRequest, decision_id: int) -> HttpResponse:
    try:
        decision = review_decisions.decision_undo(decision_id=decision_id, reviewer=request.user)
    except review_claims.DecisionConflict as error:
        messages.warning(request, str(error))
        back = request.POST.get("back", "")
        if not url_has_allowed_host_and_scheme(back, allowed_hosts={request.get_host()}):
            back = reverse("review:queue_list")  # never send people to another site
        return redirect(back)
    request.session.pop(_UNDO_SESSION_KEY, None)
    messages.success(request, f"Undone: item {decision.item_id} is yours to decide again.")
    return redirect("review:item", item_id=decision.item_id)


@require_POST
def automation_undo(request: PageRequest, automation_id: int) -> HttpResponse:
    """A reviewer of the queue takes an automatic application back; the item goes to review."""
    automation = get_object_or_404(Automation.objects.select_related("item"), pk=automation_id)
    item = _item_for(request, automation.item_id)
    review_check(request.user, item.queue)
    try:
        review_automation.automation_undo(automation_id=automation.pk, actor=request.user)
    except review_claims.DecisionConflict as error:
        messages.warning(request, str(error))
    else:
        messages.success(request, f"Undone: item {item.pk} is back in review.")
    return redirect("review:item", item_id=item.pk)


@require_POST
def skip(request: PageRequest, item_id: int) -> HttpResponse:
    item = _item_for(request, item_id)
    review_check(request.user, item.queue)
    review_claims.claim_release(item_id=item.pk, reviewer=request.user, skipped=True)
    messages.info(request, f"Skipped item {item.pk}.")
    return _go_to_next(request, item.queue)


@require_POST
def candidate_retry(request: HttpRequest, candidate_id: int) -> HttpResponse:
    candidate = get_object_or_404(
        Candidate.objects.select_related("generation__item"), pk=candidate_id
    )
    return _regeneration(
        request,
        candidate.generation.item,
        lambda reviewer: review_claims.candidate_retry(
            candidate_id=candidate.pk, reviewer=reviewer
        ),
        done=f"Retrying candidate {candidate.label}.",
    )


@require_POST
def item_regenerate(request: HttpRequest, item_id: int) -> HttpResponse:
    item = get_object_or_404(Item, pk=item_id)
    return _regeneration(
        request,
        item,
        lambda reviewer: review_claims.item_regenerate(item_id=item.pk, reviewer=reviewer),
        done="Generating a new set of candidates.",
    )


@require_POST
def item_try_again(request: HttpRequest, item_id: int) -> HttpResponse:
    """A new round with this one's answers and the reviewer's ratings as earlier attempts."""
    item = get_object_or_404(Item, pk=item_id)
    form = TryAgainForm(request.POST)
    if not form.is_valid():
        review_check(request.user, queue_for_member(request.user, pk=item.queue_id))
        messages.error(request, _form_problem(form))
        return redirect("review:item", item_id=item.pk)
    return _regeneration(
        request,
        item,
        lambda reviewer: review_claims.item_try_again(
            item_id=item.pk,
            reviewer=reviewer,
            ratings=form.cleaned_data["ratings"],
            reasons=form.cleaned_data["reason_tags"],
            comment=form.cleaned_data["comment"].replace("\r\n", "\n"),
            shown_candidate_ids=form.cleaned_data["shown_candidate_ids"],
        ),
        done="Trying again: the new candidates are written with these answers and their "
        "rewards in view.",
    )


def _regeneration(
    request: HttpRequest, item: Item, action: Callable[[User], object], *, done: str
) -> HttpResponse:
    """Retry and regenerate: for reviewers of the item's queue, under the claim rule; the item
    page says what happened."""
    review_check(request.user, queue_for_member(request.user, pk=item.queue_id))
    if not isinstance(request.user, User):  # review_check lets only a reviewer through
        raise PermissionDenied
    try:
        action(request.user)
    except review_claims.DecisionConflict as error:
        messages.error(request, str(error))
    except ValidationError as error:
        messages.error(request, " ".join(error.messages))
    else:
        messages.info(request, done)
    return redirect("review:item", item_id=item.pk)
