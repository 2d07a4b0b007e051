import statistics
import time
from collections import Counter
from dataclasses import dataclass, fields
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypedDict

from django.conf import settings
from django.contrib.auth.models import User
from django.db.models import Count, Exists, F, OuterRef, Q, QuerySet
from django.utils import timezone

from icrlhf.generation import selectors as generation_selectors
from icrlhf.generation.models import Candidate, Generation
from icrlhf.kinds import QueueKind, kind_of
from icrlhf.queues.access import can_review
from icrlhf.queues.models import Item, Queue
from icrlhf.review import guard, judgements, live
from icrlhf.review.models import Automation, Claim, Decision, standing_filter

if TYPE_CHECKING:  # subscripted, it fails at run time
    from django_stubs_ext import WithAnnotations

_MEDIAN_WINDOW = 200


@dataclass(frozen=True)
class ReviewProgress:
    decided_today: int
    backlog: int
    median_seconds: float | None

    @property
    def day_total(self) -> int:
        """Today's work as far as it is known: what this reviewer decided, and what waits."""
        return self.decided_today + self.backlog


def decisions_standing(*, item: Item) -> QuerySet[Decision]:
    return (
        item.decisions.standing()
        .select_related("reviewer", "chosen_candidate")
        .order_by("created_at")
    )


def reviewable() -> Q:
    """Items a reviewer can work on: ready, or still generating with a finished candidate in
    the running generation (candidates are pickable as they arrive)."""
    finished = Candidate.objects.filter(
        generation__item=OuterRef("pk"),
        generation__status=Generation.Status.RUNNING,
        status=Candidate.Status.DONE,
    )
    return Q(status=Item.Status.READY) | Q(Exists(finished), status=Item.Status.GENERATING)


class FreeSlots(TypedDict):
    """What `items_with_free_slots` adds to each item."""

    free_slots: int


def items_with_free_slots(
    items: QuerySet[Item], *, reviewer: User, now: datetime
) -> "QuerySet[WithAnnotations[Item, FreeSlots]]":
    """The items, each with `free_slots`: the reviewers it can still take besides this one
    (the queue's reviewers per item, less its standing decisions and other reviewers' live
    claims; this reviewer's own claim takes no one's slot)."""
    return items.annotate(
        free_slots=F("queue__reviewers_per_item")
        - Count("decisions", filter=standing_filter("decisions"), distinct=True)
        - Count(
            "claims",
            filter=Q(claims__expires_at__gt=now) & ~Q(claims__reviewer=reviewer),
            distinct=True,
        )
    )


def free_slots(*, item: Item, reviewer: User, now: datetime) -> int:
    """`items_with_free_slots` of one item."""
    items = items_with_free_slots(Item.objects.filter(pk=item.pk), reviewer=reviewer, now=now)
    slots: int = items.values_list("free_slots", flat=True).get()
    return slots


def automation_latest(*, item: Item) -> Automation | None:
    """The item's last automatic application (standing, audited or undone), if any."""
    return (
        item.automations.select_related("candidate", "undone_by", "audit_decision__reviewer")
        .order_by("-created_at", "-pk")
        .first()
    )


def claims_active(*, item: Item) -> QuerySet[Claim]:
    return item.claims.filter(expires_at__gt=timezone.now()).select_related("reviewer")


def review_progress(*, queue: Queue, reviewer: User) -> ReviewProgress:
    midnight = timezone.localtime().replace(hour=0, minute=0, second=0, microsecond=0)
    decisions = Decision.objects.standing().filter(item__queue=queue)
    times = [
        ms
        for ms in decisions.exclude(time_to_decide_ms=None)
        .order_by("-created_at")
        .values_list("time_to_decide_ms", flat=True)[:_MEDIAN_WINDOW]
        if ms is not None
    ]
    return ReviewProgress(
        decided_today=decisions.filter(reviewer=reviewer, created_at__gte=midnight).count(),
        backlog=queue.items.filter(status=Item.Status.READY).count(),
        median_seconds=statistics.median(times) / 1000 if times else None,
    )


@dataclass(frozen=True)
class DaySummary:
    """A reviewer's day in a queue, for the end of the queue: decided, by verdict."""

    by_verdict: list[tuple[str, int]]  # (verdict's label, count), the verdicts given today

    @property
    def decided(self) -> int:
        return sum(count for _, count in self.by_verdict)


def review_day_summary(*, queue: Queue, reviewer: User) -> DaySummary:
    midnight = timezone.localtime().replace(hour=0, minute=0, second=0, microsecond=0)
    counts = Counter(
        Decision.objects.standing()
        .filter(item__queue=queue, reviewer=reviewer, created_at__gte=midnight)
        .values_list("verdict", flat=True)
    )
    return DaySummary(
        by_verdict=[
            (label, counts[value]) for value, label in Decision.Verdict.choices if counts[value]
        ]
    )


def items_skipped(*, queue: Queue, reviewer: User) -> QuerySet[Item]:
    """What this reviewer skipped in the queue and is still open to them (not what they
    have taken again)."""
    return (
        Item.objects.filter(
            queue=queue,
            status=Item.Status.READY,
            claims__reviewer=reviewer,
            claims__skipped=True,
        )
        .exclude(claims__reviewer=reviewer, claims__expires_at__gt=timezone.now())
        .exclude(Q(decisions__reviewer=reviewer) & standing_filter("decisions"))
        .order_by("created_at")
    )


@dataclass(frozen=True)
class Outcome:
    """An item as its sender sees it: its latest candidates and its first standing decision."""

    candidates: list[Candidate]
    decision: Decision | None
    automation: Automation | None


def item_outcome(*, item: Item) -> Outcome:
    generation = item.generations.order_by("-created_at").first()
    return Outcome(
        candidates=[] if generation is None else list(generation.candidates.order_by("position")),
        decision=item.decisions.first_standing_per_item().first(),
        automation=automation_latest(item=item),
    )


Message = dict[str, Any]


@dataclass(frozen=True)
class StepState:
    """What an agent decided from, for the first screen of a captured step: its goal, what it
    observed since its last action (the tool results, or the user's next words), and the
    turns before, folded."""

    goal: str
    latest: list[Message]
    earlier: list[Message]
    tool_names: list[str]


def step_state(*, item: Item) -> StepState | None:
    """The state of a captured agent step; None for anything else (a ticket, a prompt, a
    one-turn call), whose input is shown as it is."""
    conversation: list[Message] = [
        m for m in item.conversation if m.get("role") not in ("system", "developer")
    ]
    tools = (item.call_options or {}).get("tools") or []
    has_turns = any(m.get("role") == "assistant" for m in conversation)
    if item.source != Item.Source.GATEWAY or not (has_turns or tools):
        return None
    last_action = max(
        (n for n, m in enumerate(conversation) if m.get("role") == "assistant"), default=-1
    )
    goal = next((m for m in conversation if m.get("role") == "user"), None)
    earlier = conversation[: last_action + 1]
    return StepState(
        goal=_text(goal) if goal is not None else "",
        latest=[m for m in conversation[last_action + 1 :] if m is not goal],
        # The goal is shown on its own: folded are the turns between it and the latest.
        earlier=[m for m in earlier if m is not goal],
        tool_names=[str((tool.get("function") or {}).get("name", "")) for tool in tools if tool],
    )


def _text(message: Message) -> str:
    content = message.get("content")
    if isinstance(content, list):  # OpenAI's content parts
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content or "")


@dataclass(frozen=True)
class RoundAnswer:
    label: int
    text: str
    tool_calls: list[dict[str, Any]]
    # The reviewer's rating as a reward (1 → 0.0 … 5 → 1.0); None: not rated, sent back as
    # rejected (0.0).
    reward: float | None


@dataclass(frozen=True)
class EarlierRound:
    """A round a reviewer sent back with "try again": its answers as they were, how each was
    rated, and what the reviewer said. The next round was written with all of it in view."""

    number: int
    answers: list[RoundAnswer]
    reasons: list[str]
    comment: str
    reviewer: str


def rounds_earlier(*, item: Item) -> list[EarlierRound]:
    sent = item.generations.filter(try_again__isnull=False).order_by("created_at", "pk")
    rounds = []
    for number, generation in enumerate(sent.prefetch_related("candidates"), 1):
        said = generation.try_again or {}
        rewards = said.get("rewards") or {}
        done = sorted(
            (c for c in generation.candidates.all() if c.status == Candidate.Status.DONE),
            key=lambda c: c.position,
        )
        rounds.append(
            EarlierRound(
                number=number,
                answers=[
                    RoundAnswer(
                        label=c.label,
                        text=c.text,
                        tool_calls=c.tool_calls,
                        reward=rewards.get(str(c.pk)),
                    )
                    for c in done
                ],
                reasons=list(said.get("reasons") or []),
                comment=str(said.get("comment") or ""),
                reviewer=str(said.get("reviewer") or ""),
            )
        )
    return rounds


@dataclass(frozen=True)
class CandidateCard:
    """A candidate as the item page shows it, with what its row does not say."""

    candidate: Candidate
    problem: live.Problem  # a failed or retrying one's error, as a reviewer reads it
    waiting: str  # a pending or running one's state
    prefill: dict[str, str]  # what picking it puts into the kind's correction fields


@dataclass(frozen=True)
class ItemPage:
    """What the workbench shows of one item to one user, and what they may do there. Its
    fields are the item template's names (`context`)."""

    item: Item
    queue: Queue
    kind: QueueKind
    generation: Generation | None
    cards: list[CandidateCard]
    # The categories the candidates propose, first in the kind's category list; then every
    # other one, sorted (`QueueKind.category_choices`).
    likely_categories: list[str]
    other_categories: list[str]
    step_state: StepState | None
    # Rounds a reviewer sent back with "try again" before this one, as they were.
    rounds_earlier: list[EarlierRound]
    # Polling goes on until nothing can change without the reviewer (the ranking's order
    # included), so that the page always shows what a reload would.
    polling: bool
    waiting: live.Waiting | None
    # Said only when the order rests on something: this queue's decisions or memory.
    ranked_by_history: bool
    skipped_before: bool
    progress: generation_selectors.Progress | None
    retrievals: generation_selectors.Retrievals | None
    decisions: list[Decision]
    automation: Automation | None
    # An audit looks like any other item until decided: it is not said to be applied.
    blind: bool
    audit_agreed: bool | None
    can_undo_automation: bool
    my_decision: Decision | None
    my_claim: Claim | None
    # A reviewer who opens an item with something to pick claims it, but never by the page's
    # GET (a link from another site must not claim work): the page posts the claim as it
    # loads.
    claim_on_load: bool
    other_claims: list[Claim]
    # Controls appear with the first finished candidate; the others join as they arrive, and
    # polling keeps (hx-preserve) what the reviewer has picked or typed. (Taken as the page
    # loads when not yet held: deciding still checks the hold.)
    can_decide: bool
    # Regenerating or retrying follows the claim: not while someone else holds the item.
    can_regenerate: bool
    shown_at_ms: int
    comment_max_chars: int
    undo_window_s: int
    claim_renew_ms: int
    review_progress: ReviewProgress | None  # a reviewer's, on the whole page (not its polls)

    def context(self) -> dict[str, object]:
        return {field.name: getattr(self, field.name) for field in fields(self)}


@dataclass(frozen=True)
class ItemStanding:
    """Where an item stands for one user, as plain facts: what the workbench's permissions
    are decided from (`item_permissions`)."""

    reviewer: bool  # the user may review the item's queue
    open_to_pick: bool  # the item is ready and wants more decisions (`reviewable`)
    free_slot: bool  # a reviewer's slot on it is free for this user
    decided_by_me: bool
    claimed_by_me: bool
    claimed_by_others: bool
    skipped_by_me: bool  # the user's claim says they skipped the item
    decided: bool  # by anyone
    has_generation: bool
    ready_or_failed: bool  # the item's status allows regenerating
    automation: Automation | None  # the latest, undone or not


@dataclass(frozen=True)
class ItemPermissions:
    """What the user may do on the item page, and what it hides (`ItemPage`'s comments say
    why each rule is so)."""

    claim_on_load: bool
    can_decide: bool
    can_regenerate: bool
    can_undo_automation: bool
    blind: bool
    skipped_before: bool


def item_permissions(standing: ItemStanding) -> ItemPermissions:
    """The page's permissions from where the item stands: a pure function, tested by table."""
    claim_on_load = (
        standing.reviewer
        and standing.open_to_pick
        and not standing.decided_by_me
        and not standing.claimed_by_me
        and standing.free_slot
    )
    # The automation that stands (an undone one neither hides the item nor can be undone).
    applied = standing.automation if standing.automation and standing.automation.standing else None
    return ItemPermissions(
        claim_on_load=claim_on_load,
        can_decide=standing.reviewer
        and not standing.decided_by_me
        and standing.open_to_pick
        and (standing.claimed_by_me or claim_on_load)
        and standing.has_generation,
        can_regenerate=standing.reviewer
        and standing.ready_or_failed
        and not standing.decided
        and (standing.claimed_by_me or not standing.claimed_by_others),
        can_undo_automation=standing.reviewer and applied is not None and not applied.audit,
        blind=applied is not None and applied.audit and applied.audit_decision_id is None,
        skipped_before=standing.skipped_by_me and not standing.decided_by_me,
    )


def item_page(*, item: Item, user: User, poll: bool) -> ItemPage:
    """The workbench for one item as `user` sees it; `poll`: for a refresh of its live part.
    In the order the page is made: the item's latest state, where it stands for the user,
    the candidates as cards, the permissions, then the page."""
    generation = _item_latest(item)
    decisions = list(decisions_standing(item=item))
    mine = next((d for d in decisions if d.reviewer_id == user.pk), None)
    claims = list(claims_active(item=item))
    my_claim = next((c for c in claims if c.reviewer_id == user.pk), None)
    reviewer = can_review(user, item.queue)
    automation = automation_latest(item=item)
    allowed = item_permissions(
        _item_standing(
            item=item,
            user=user,
            reviewer=reviewer,
            generation=generation,
            decisions=decisions,
            mine=mine,
            claims=claims,
            my_claim=my_claim,
            automation=automation,
        )
    )
    kind = kind_of(item.queue)
    now = timezone.now()
    candidates = (
        list(generation_selectors.generation_candidates(generation=generation))
        if generation
        else []
    )
    cards = _candidate_cards(item=item, user=user, kind=kind, candidates=candidates, now=now)
    likely, others = kind.category_choices(
        proposed=[card.prefill for card in cards], queue=item.queue
    )
    return ItemPage(
        item=item,
        queue=item.queue,
        kind=kind,
        generation=generation,
        cards=cards,
        likely_categories=likely,
        other_categories=others,
        step_state=step_state(item=item),
        rounds_earlier=rounds_earlier(item=item),
        polling=generation is not None
        and not live.generation_settled(generation=generation, decided=bool(decisions), now=now),
        waiting=live.generation_waiting(
            generation=generation,
            candidates=candidates,
            ahead=live.generations_ahead(generation=generation),
            now=now,
        )
        if generation
        else None,
        ranked_by_history=generation is not None
        and generation.ranked_at is not None
        and bool(generation.calibration_id or generation.stored_examples),
        skipped_before=allowed.skipped_before,
        progress=(
            generation_selectors.generation_progress(generation=generation) if generation else None
        ),
        retrievals=(
            generation_selectors.generation_retrievals(generation=generation)
            if generation
            else None
        ),
        decisions=decisions,
        automation=automation,
        blind=allowed.blind,
        audit_agreed=guard.audit_agreed(automation) if automation else None,
        can_undo_automation=allowed.can_undo_automation,
        my_decision=mine,
        my_claim=my_claim,
        claim_on_load=allowed.claim_on_load,
        other_claims=[c for c in claims if c.reviewer_id != user.pk],
        can_decide=allowed.can_decide,
        can_regenerate=allowed.can_regenerate,
        shown_at_ms=int(time.time() * 1000),
        comment_max_chars=judgements.MAX_COMMENT_CHARS,
        undo_window_s=settings.REVIEW_UNDO_WINDOW_S,
        claim_renew_ms=max(5, settings.REVIEW_CLAIM_TTL_S // 3) * 1000,
        review_progress=(
            review_progress(queue=item.queue, reviewer=user) if reviewer and not poll else None
        ),
    )


def _item_latest(item: Item) -> Generation | None:
    """The item's latest generation, and its status read again after it: the worker finishes
    a generation and readies its item in one transaction, but `item` was read before, so a
    poll could see a finished generation with an item still generating (and stop polling
    with nothing to pick). PostgreSQL's READ COMMITTED showed this in the tests."""
    generation = generation_selectors.generation_latest(item=item)
    item.refresh_from_db(fields=["status"])
    return generation


def _item_standing(
    *,
    item: Item,
    user: User,
    reviewer: bool,
    generation: Generation | None,
    decisions: list[Decision],
    mine: Decision | None,
    claims: list[Claim],
    my_claim: Claim | None,
    automation: Automation | None,
) -> ItemStanding:
    open_to_pick = Item.objects.filter(pk=item.pk).filter(reviewable()).exists()
    return ItemStanding(
        reviewer=reviewer,
        open_to_pick=open_to_pick,
        # Counted only where it can matter (a slot is a query): for a reviewer who has
        # neither decided the item nor claimed it.
        free_slot=reviewer
        and open_to_pick
        and mine is None
        and my_claim is None
        and free_slots(item=item, reviewer=user, now=timezone.now()) > 0,
        decided_by_me=mine is not None,
        claimed_by_me=my_claim is not None,
        claimed_by_others=any(c.reviewer_id != user.pk for c in claims),
        skipped_by_me=my_claim is not None and my_claim.skipped,
        decided=bool(decisions),
        has_generation=generation is not None,
        ready_or_failed=item.status in {Item.Status.READY, Item.Status.FAILED},
        automation=automation,
    )


def _candidate_cards(
    *, item: Item, user: User, kind: QueueKind, candidates: list[Candidate], now: datetime
) -> list[CandidateCard]:
    return [
        CandidateCard(
            candidate=candidate,
            problem=live.candidate_problem(candidate=candidate, show_detail=user.is_staff),
            waiting=live.candidate_waiting(candidate=candidate, now=now),
            prefill=kind.prefill(text=candidate.text, fields=candidate.fields, queue=item.queue),
        )
        for candidate in candidates
    ]
