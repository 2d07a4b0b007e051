"""Who works on which item: claims with a lease, the next item for a reviewer, and the claim
rule that regenerating or retrying follows. Decisions are `decisions.py`."""

from collections.abc import Sequence
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from icrlhf.generation import selectors as generation_selectors
from icrlhf.generation import services as generation_services
from icrlhf.generation.models import Candidate, Generation
from icrlhf.kinds import kind_of
from icrlhf.memory.services import rating_reward
from icrlhf.queues.locks import item_lock
from icrlhf.queues.models import Item, Queue
from icrlhf.review.judgements import comment_check, ratings_check, reasons_check
from icrlhf.review.models import Claim, standing_filter
from icrlhf.review.selectors import free_slots, items_with_free_slots, reviewable

# How many of the oldest open items "next item" tries before saying the queue is empty.
_NEXT_ITEM_WINDOW = 50


class DecisionConflict(Exception):
    """The item cannot take this decision (already decided, claimed by someone else…)."""


def claim_ttl() -> timedelta:
    return timedelta(seconds=settings.REVIEW_CLAIM_TTL_S)


def shown_check(shown_candidate_ids: Sequence[int] | None, *, generation: Generation) -> None:
    """A page's decision stands on the candidates it showed: the generation's, each once (not
    checked when the page did not say). Else nothing is saved."""
    if shown_candidate_ids is None:
        return
    stored = set(generation.candidates.values_list("pk", flat=True))
    shown = list(shown_candidate_ids)
    if len(shown) != len(set(shown)) or set(shown) != stored:
        raise DecisionConflict(
            "Your page did not show this item's candidates as they are stored, so nothing "
            "was saved. Here they are as they are now: please decide again."
        )


@transaction.atomic
def claim_take(*, item_id: int, reviewer: User) -> datetime | None:
    """Claim (or renew the claim on) an item; returns the expiry, or None when it is not
    open to this reviewer (nothing to pick yet, decided by them, or held by enough others)."""
    item = item_lock(item_id)
    now = timezone.now()
    if not Item.objects.filter(pk=item.pk).filter(reviewable()).exists():
        return None
    if item.decisions.standing().filter(reviewer=reviewer).exists():
        return None
    if free_slots(item=item, reviewer=reviewer, now=now) <= 0:
        return None
    expires_at = now + claim_ttl()
    # A skip stays recorded when the item comes back: the page tells the reviewer so.
    Claim.objects.update_or_create(
        item=item, reviewer=reviewer, defaults={"expires_at": expires_at}
    )
    return expires_at


def claim_next(*, queue: Queue, reviewer: User) -> Item | None:
    """The reviewer's open claim in this queue, else the oldest item they can claim."""
    now = timezone.now()
    held = (
        Item.objects.filter(reviewable())
        .filter(
            queue=queue,
            claims__reviewer=reviewer,
            claims__expires_at__gt=now,
        )
        .order_by("created_at")
        .first()
    )
    if held is not None:
        return held
    # Items whose every slot is held by other reviewers' live claims are left out here, not
    # tried one by one: with many reviewers on one queue, the oldest items are all taken.
    candidates = items_with_free_slots(
        Item.objects.filter(reviewable())
        .filter(queue=queue)
        .exclude(Q(decisions__reviewer=reviewer) & standing_filter("decisions")),
        reviewer=reviewer,
        now=now,
    ).filter(free_slots__gt=0)
    # What this reviewer skipped comes back to them only after everything else (to others,
    # it comes in its usual place).
    skipped = Claim.objects.filter(item=OuterRef("pk"), reviewer=reviewer, skipped=True)
    ordered = kind_of(queue).review_order(candidates)
    open_items = (
        ordered.annotate(skipped_by_me=Exists(skipped))
        .order_by("skipped_by_me", *ordered.query.order_by)
        .values_list("pk", flat=True)[:_NEXT_ITEM_WINDOW]
    )
    for item_id in open_items:
        if claim_take(item_id=item_id, reviewer=reviewer) is not None:
            return Item.objects.get(pk=item_id)
    return None


def claim_release(*, item_id: int, reviewer: User, skipped: bool = False) -> None:
    """Let go of an item; a skip also puts it last in this reviewer's "next item"."""
    now = timezone.now()
    if skipped:
        Claim.objects.update_or_create(
            item_id=item_id, reviewer=reviewer, defaults={"expires_at": now, "skipped": True}
        )
    else:
        Claim.objects.filter(item_id=item_id, reviewer=reviewer).update(expires_at=now)


def _held_by_another(item: Item, reviewer: User, now: datetime) -> User | None:
    """Whoever else holds a live claim on the item, unless this reviewer holds one too."""
    claims = item.claims.filter(expires_at__gt=now).select_related("reviewer")
    if any(claim.reviewer_id == reviewer.pk for claim in claims):
        return None
    return next((claim.reviewer for claim in claims), None)


def _refuse_if_held(item: Item, reviewer: User, action: str) -> None:
    holder = _held_by_another(item, reviewer, timezone.now())
    if holder is not None:
        raise DecisionConflict(
            f"{holder.get_username()} is working on this item, so it cannot be {action} now."
        )


@transaction.atomic
def item_regenerate(*, item_id: int, reviewer: User) -> Generation:
    """A fresh set of candidates, unless another reviewer holds the item: their choice or
    edit would otherwise be refused for candidates replaced under them."""
    item = item_lock(item_id)
    _refuse_if_held(item, reviewer, "regenerated")
    if item.automations.standing().exists():
        raise ValidationError(
            "This item was applied automatically; undo that first, then regenerate."
        )
    return generation_services.generation_regenerate(item_id=item_id)


@transaction.atomic
def item_try_again(
    *,
    item_id: int,
    reviewer: User,
    ratings: dict[int, int],
    reasons: list[str],
    comment: str,
    shown_candidate_ids: Sequence[int] | None = None,
) -> Generation:
    """A new round with this one's answers and their rewards in its prompt, under the same
    claim rule as regenerating. `ratings` (1…5, optional) are checked like a decision's, and
    the round sent back must be the one the page showed."""
    item = item_lock(item_id)
    _refuse_if_held(item, reviewer, "tried again")
    if item.automations.standing().exists():
        raise ValidationError("This item was applied automatically; undo that first.")
    generation = generation_selectors.generation_latest(item=item)
    if generation is not None:
        shown_check(shown_candidate_ids, generation=generation)
        ratings_check(ratings, generation=generation)
    reasons_check(reasons, queue=item.queue)
    comment_check(comment)
    return generation_services.generation_try_again(
        item_id=item_id,
        rewards={candidate: rating_reward(rating) for candidate, rating in ratings.items()},
        reasons=list(dict.fromkeys(reasons)),
        comment=comment.strip(),
        reviewer=reviewer.get_username(),
    )


@transaction.atomic
def candidate_retry(*, candidate_id: int, reviewer: User) -> None:
    """Try a failed candidate again, under the same claim rule as regenerating."""
    item_id = Candidate.objects.values_list("generation__item_id", flat=True).get(pk=candidate_id)
    _refuse_if_held(item_lock(item_id), reviewer, "retried")
    generation_services.candidate_retry(candidate_id=candidate_id)
