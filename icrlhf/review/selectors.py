import statistics
from collections import Counter
from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import User
from django.db.models import QuerySet
from django.utils import timezone

from icrlhf.generation.models import Candidate
from icrlhf.queues.models import Item, Queue
from icrlhf.review.models import Automation, Claim, Decision

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
        .exclude(decisions__reviewer=reviewer, decisions__superseded_at__isnull=True)
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
        decision=item.decisions.standing().order_by("created_at").first(),
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
