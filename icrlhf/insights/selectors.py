"""What a queue's dashboard shows: how its decisions, its memory and its retrieval evolve."""

import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta

from django.db.models import Count, F, Max, Q, QuerySet
from django.db.models.functions import TruncDate
from django.utils import timezone

from icrlhf.gateway.call_log import JournalState, journal_state
from icrlhf.gateway.models import Call
from icrlhf.gateway.pace import Pace, queue_pace
from icrlhf.generation.models import Candidate, Generation
from icrlhf.insights.stats import two_proportion_p, wilson
from icrlhf.kinds import kind_of
from icrlhf.kinds.labels import answer_key
from icrlhf.memory.models import Example
from icrlhf.queues.access import AnyUser, is_admin
from icrlhf.queues.models import Queue
from icrlhf.review.guard import audit_agreed
from icrlhf.review.models import Automation, Decision
from icrlhf.trajectories.models import Trajectory

# A generation "found something relevant" when its best retrieved example is at least this
# similar (cosine, all-MiniLM-L6-v2): paraphrases of one request score well above it.
RELEVANT_SIMILARITY = 0.5
DAYS = 30
DECISIONS_PER_POINT = 25


@dataclass
class Window:
    """Decision outcomes over one day, or over a run of consecutive decisions."""

    label: str
    decisions: int = 0
    chosen: int = 0
    chosen_from_memory: int = 0
    edited: int = 0
    none_acceptable: int = 0
    times_ms: list[int] = field(default_factory=list)

    def rate(self, count: int) -> float | None:
        return count / self.decisions if self.decisions else None

    @property
    def median_seconds(self) -> float | None:
        return statistics.median(self.times_ms) / 1000 if self.times_ms else None

    def add(self, *, verdict: str, from_memory: bool, time_ms: int | None) -> None:
        self.decisions += 1
        if verdict == Decision.Verdict.CHOSEN:
            self.chosen += 1
            self.chosen_from_memory += from_memory
        elif verdict == Decision.Verdict.EDITED:
            self.edited += 1
        else:
            self.none_acceptable += 1
        if time_ms is not None:
            self.times_ms.append(time_ms)


@dataclass(frozen=True)
class Memory:
    preferred_live: int  # active or pinned: what retrieval can use
    pinned: int
    retired: int
    rejected: int
    preferred_by_day: list[int]  # preferred examples stored by the end of each day


@dataclass(frozen=True)
class Retrieval:
    generations: int
    relevant: int
    relevant_by_day: list[float | None]

    @property
    def relevant_rate(self) -> float | None:
        return self.relevant / self.generations if self.generations else None


@dataclass(frozen=True)
class ServingDay:
    calls: int
    memory_used: int  # calls whose retrieval found examples (or answered from one)
    from_memory: int  # calls answered from memory, with no model call
    failed: int
    latency_p95_ms: float | None  # of the day's successful calls (the latest 2,000)

    def rate(self, count: int) -> float | None:
        return count / self.calls if self.calls else None


@dataclass(frozen=True)
class Serving:
    """What the gateway served for the queue, per day."""

    totals: ServingDay
    by_day: list[ServingDay]


@dataclass
class Arm:
    """Reviewed captured calls of one arm: how often reviewers took what was served as is."""

    reviewed: int = 0
    accepted: int = 0

    @property
    def rate(self) -> float | None:
        return self.accepted / self.reviewed if self.reviewed else None

    @property
    def interval(self) -> tuple[float, float] | None:
        return wilson(self.accepted, self.reviewed) if self.reviewed else None


def _difference(a: Arm, b: Arm) -> float | None:
    """The first arm's rate less the second's, in points of share."""
    return None if a.rate is None or b.rate is None else a.rate - b.rate


def _p_value(a: Arm, b: Arm) -> float | None:
    """Two-sided two-proportion test of the arms' rates (None until both have items)."""
    if not a.reviewed or not b.reviewed:
        return None
    return two_proportion_p(a.accepted, a.reviewed, b.accepted, b.reviewed)


# Below this many decided items in an arm, a difference that is not significant says nothing
# yet ("not enough to tell"); with as many in each, it says the difference is small. (A test
# of two proportions at 30 each catches a gap of about 35 points four times in five.)
ENOUGH_PER_ARM = 30


@dataclass(frozen=True)
class Comparison:
    """Two arms compared, in words: what the numbers say and what to do next; the test
    behind them is `detail`, shown one click away."""

    telling: bool  # the difference means something: significant, or enough in each arm
    said: str
    next: str | None
    detail: str | None


def compare(
    first: Arm,
    second: Arm,
    *,
    effect: str,
    names: tuple[str, str],
    blocked: str | None = None,
) -> Comparison:
    """`effect` names what the difference measures ("Memory's effect"), `names` the arms;
    `blocked` is what to do when an arm can get no items (its share is 0)."""
    counts = f"{first.reviewed} {names[0]}, {second.reviewed} {names[1]}"
    difference, p = _difference(first, second), _p_value(first, second)
    detail = (
        None
        if difference is None or p is None
        else f"A difference of {difference * 100:+.0f} points; a two-sided test of two "
        "proportions (Fisher's exact test where a count is expected below 5) gives "
        f"p = {p:.3f}, the chance of a gap at least this large were both arms alike. Below "
        "0.05, the difference is taken as real."
    )
    missing = [
        f"{ENOUGH_PER_ARM - arm.reviewed} more {name}"
        for arm, name in zip((first, second), names, strict=True)
        if arm.reviewed < ENOUGH_PER_ARM
    ]
    more = blocked or (
        f"decide {' and '.join(missing)}: {ENOUGH_PER_ARM} in each are enough to tell."
        if missing
        else None
    )
    if difference is None or p is None:
        return Comparison(False, f"{effect}: nothing to compare yet ({counts}).", more, None)
    points = f"{difference * 100:+.0f} points"
    if p < 0.05:
        said = f"{effect}: {points}, more than chance would explain ({counts})."
        return Comparison(True, said, None, detail)
    if missing:
        said = f"{effect}: not enough decided items to tell yet ({counts})."
        return Comparison(False, said, more, detail)
    said = f"{effect}: no clear difference ({points} could be chance; {counts})."
    return Comparison(True, said, None, detail)


@dataclass(frozen=True)
class Holdout:
    """What memory is worth on the queue's own traffic: served answers shaped by memory
    against the held-out ones answered without it, as reviewers judged them."""

    with_memory: Arm
    without_memory: Arm
    # Per day (the dashboard's days): (with memory, without).
    by_day: list[tuple[Arm, Arm]]
    words: Comparison

    @property
    def difference(self) -> float | None:
        return _difference(self.with_memory, self.without_memory)

    @property
    def p_value(self) -> float | None:
        return _p_value(self.with_memory, self.without_memory)


@dataclass(frozen=True)
class AutomationDay:
    ranked: int  # items whose candidates were ranked that day
    automated: int  # of which applied without review
    audit: Arm  # audited automations (by the day they were applied): kept as applied

    @property
    def share(self) -> float | None:
        return self.automated / self.ranked if self.ranked else None


@dataclass(frozen=True)
class AutomationBoard:
    """What the queue applies without review, and how right it is where audited."""

    automated: int  # standing (not undone)
    undone: int
    audit: Arm
    by_day: list[AutomationDay]
    # The threshold's history, newest first: (when, who, old, new).
    thresholds: list[tuple[datetime, str, float | None, float | None]]


@dataclass
class RewardArm:
    """Agent runs the application rewarded, in one arm: how many, and their mean reward."""

    runs: int = 0
    total: float = 0.0

    @property
    def mean(self) -> float | None:
        return self.total / self.runs if self.runs else None

    def add(self, reward: float) -> None:
        self.runs += 1
        self.total += reward


@dataclass(frozen=True)
class Rewards:
    """The application's rewards on agent runs, by the day of their last step: runs whose
    calls had memory against held-out runs (answered without it)."""

    with_memory: RewardArm
    held_out: RewardArm
    by_day: list[tuple[RewardArm, RewardArm]]
    # Runs with calls in both arms (grouped by their messages, each call drawn on its own).
    mixed: int


@dataclass(frozen=True)
class Anchoring:
    """How much the order sways reviewers: how often they kept the ranking's first candidate
    as it was, on items shown best first with its confidence and on items shown blind
    (random order, no confidence). The gap is what the order itself adds."""

    shown: Arm
    blind: Arm
    words: Comparison

    @property
    def difference(self) -> float | None:
        return _difference(self.shown, self.blind)

    @property
    def p_value(self) -> float | None:
        return _p_value(self.shown, self.blind)


@dataclass(frozen=True)
class Dashboard:
    days: list[date]
    totals: Window
    by_day: list[Window]
    by_count: list[Window]
    memory: Memory
    retrieval: Retrieval
    serving: Serving
    holdout: Holdout
    automation: AutomationBoard
    rewards: Rewards
    anchoring: Anchoring


def _decisions(queue: Queue, days: list[date]) -> tuple[Window, list[Window], list[Window]]:
    by_day = {day: Window(day.strftime("%b %d")) for day in days}
    by_count: list[Window] = []
    totals = Window("all")
    rows = (
        Decision.objects.standing()
        .filter(item__queue=queue)
        .order_by("created_at", "pk")
        .values_list("created_at", "verdict", "time_to_decide_ms", "chosen_candidate__source")
    )
    for number, (created_at, verdict, time_ms, source) in enumerate(rows.iterator()):
        if number % DECISIONS_PER_POINT == 0:
            by_count.append(Window(f"{number + 1}–{number + DECISIONS_PER_POINT}"))
        day = by_day.get(timezone.localdate(created_at))
        for window in (totals, by_count[-1], *([day] if day else [])):
            window.add(
                verdict=verdict, from_memory=source == Candidate.Source.MEMORY, time_ms=time_ms
            )
    return totals, list(by_day.values()), by_count


def _memory(queue: Queue, days: list[date]) -> Memory:
    examples = Example.objects.filter(queue=queue)
    preferred = examples.filter(role=Example.Role.PREFERRED)
    counts = preferred.aggregate(
        live=Count("pk", filter=~Q(status=Example.Status.RETIRED)),
        pinned=Count("pk", filter=Q(status=Example.Status.PINNED)),
        retired=Count("pk", filter=Q(status=Example.Status.RETIRED)),
    )
    created: dict[date, int] = defaultdict(int)
    for created_at in preferred.filter(created_at__date__gte=days[0]).values_list(
        "created_at", flat=True
    ):
        created[timezone.localdate(created_at)] += 1
    stored = preferred.filter(created_at__date__lt=days[0]).count()
    by_day = []
    for day in days:
        stored += created[day]
        by_day.append(stored)
    return Memory(
        preferred_live=counts["live"],
        pinned=counts["pinned"],
        retired=counts["retired"],
        rejected=examples.filter(role=Example.Role.REJECTED).count(),
        preferred_by_day=by_day,
    )


def _retrieval(queue: Queue, days: list[date]) -> Retrieval:
    generations = Generation.objects.filter(
        item__queue=queue, status=Generation.Status.DONE
    ).annotate(top=Max("retrievals__score"))
    total = relevant = 0
    per_day: dict[date, list[int]] = defaultdict(lambda: [0, 0])
    for created_at, top in generations.values_list("created_at", "top").iterator():
        hit = top is not None and top >= RELEVANT_SIMILARITY
        total += 1
        relevant += hit
        day = per_day[timezone.localdate(created_at)]
        day[0] += 1
        day[1] += hit
    return Retrieval(
        generations=total,
        relevant=relevant,
        relevant_by_day=[
            per_day[day][1] / per_day[day][0] if day in per_day else None for day in days
        ],
    )


_LATENCY_SAMPLE = 2000


def _serving(queue: Queue, days: list[date]) -> Serving:
    used = Count("pk", filter=Q(memory=Call.Memory.USED))
    answered = Count("pk", filter=Q(source=Call.Source.MEMORY))
    failed = Count("pk", filter=~Q(status_code=200))
    calls = Call.objects.filter(queue=queue, created_at__date__gte=days[0])
    per_day = {
        row["day"]: row
        for row in calls.annotate(day=TruncDate("created_at"))
        .values("day")
        .annotate(calls=Count("pk"), used=used, answered=answered, failed=failed)
    }
    by_day = []
    for day in days:
        row = per_day.get(day)
        if row is None:
            by_day.append(ServingDay(0, 0, 0, 0, None))
            continue
        latest = calls.filter(created_at__date=day, status_code=200).order_by("-created_at")
        latencies = [
            float(ms)
            for ms in latest.values_list("total_ms", flat=True)[:_LATENCY_SAMPLE]
            if ms is not None
        ]
        by_day.append(
            ServingDay(
                calls=row["calls"],
                memory_used=row["used"],
                from_memory=row["answered"],
                failed=row["failed"],
                latency_p95_ms=_p95(latencies),
            )
        )
    all_latencies = [
        float(ms)
        for ms in calls.filter(status_code=200)
        .order_by("-created_at")
        .values_list("total_ms", flat=True)[:_LATENCY_SAMPLE]
        if ms is not None
    ]
    total = calls.aggregate(calls=Count("pk"), used=used, answered=answered, failed=failed)
    totals = ServingDay(
        calls=total["calls"],
        memory_used=total["used"],
        from_memory=total["answered"],
        failed=total["failed"],
        latency_p95_ms=_p95(all_latencies),
    )
    return Serving(totals=totals, by_day=by_day)


def _p95(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def _holdout(queue: Queue, days: list[date]) -> Holdout:
    """Each reviewed captured call, judged once (its item's first standing decision), on the
    day it was served: accepted when the reviewer took the served candidate as it was."""
    with_memory, without_memory = Arm(), Arm()
    by_day = {day: (Arm(), Arm()) for day in days}
    judged: set[int] = set()
    rows = (
        Decision.objects.filter(item__queue=queue, item__calls__isnull=False)
        .first_standing_per_item()
        .values_list(
            "item_id",
            "item__calls__created_at",
            "verdict",
            "chosen_candidate__served",
            "item__calls__holdout",
        )
    )
    for item_id, served_at, verdict, served, holdout in rows.iterator():
        if item_id in judged:  # a row per call: an item made of several calls counts once
            continue
        judged.add(item_id)
        accepted = verdict == Decision.Verdict.CHOSEN and bool(served)
        day = by_day.get(timezone.localdate(served_at))
        for arm in (without_memory if holdout else with_memory, *([day[holdout]] if day else [])):
            arm.reviewed += 1
            arm.accepted += accepted
    return Holdout(
        with_memory=with_memory,
        without_memory=without_memory,
        by_day=list(by_day.values()),
        words=compare(
            with_memory,
            without_memory,
            effect="Memory's effect",
            names=("with memory", "without"),
            blocked=None
            if queue.holdout_percent
            else "set a holdout share in the routing rules: with none, no more calls are "
            "answered without memory to compare with.",
        ),
    )


def _rewards(queue: Queue, days: list[date]) -> Rewards:
    """Each rewarded run once: its reward, or success as 1 and failure as 0."""
    since = timezone.make_aware(datetime.combine(days[0], datetime.min.time()))
    with_memory, held_out, mixed = RewardArm(), RewardArm(), 0
    by_day = {day: (RewardArm(), RewardArm()) for day in days}
    runs = (
        Trajectory.objects.filter(queue=queue, last_step_at__gte=since)
        .filter(Q(reward__isnull=False) | ~Q(outcome=""))
        .annotate(
            calls=Count("steps__call"),
            held=Count("steps__call", filter=Q(steps__call__holdout=True)),
        )
        .values_list("last_step_at", "reward", "outcome", "calls", "held")
    )
    for last_step_at, reward, outcome, calls, held in runs.iterator():
        if not calls or 0 < held < calls:
            mixed += 1
            continue
        value = reward if reward is not None else float(outcome == Trajectory.Outcome.SUCCEEDED)
        arm = 1 if held else 0
        day = by_day.get(timezone.localdate(last_step_at))
        for each in ((with_memory, held_out)[arm], *([day[arm]] if day else [])):
            each.add(value)
    return Rewards(
        with_memory=with_memory, held_out=held_out, by_day=list(by_day.values()), mixed=mixed
    )


def _automation(queue: Queue, days: list[date]) -> AutomationBoard:
    since = timezone.make_aware(datetime.combine(days[0], datetime.min.time()))
    ranked: dict[date, int] = defaultdict(int)
    for ranked_at in Generation.objects.filter(item__queue=queue, ranked_at__gte=since).values_list(
        "ranked_at", flat=True
    ):
        ranked[timezone.localdate(ranked_at)] += 1
    automated: dict[date, int] = defaultdict(int)
    audits = {day: Arm() for day in days}
    totals, undone = Arm(), 0
    for automation in Automation.objects.filter(
        item__queue=queue, created_at__gte=since
    ).select_related("audit_decision"):
        day = timezone.localdate(automation.created_at)
        if not automation.standing:
            undone += 1
            continue
        automated[day] += 1
        agreed = audit_agreed(automation)
        if agreed is None:
            continue
        for arm in (totals, *([audits[day]] if day in audits else [])):
            arm.reviewed += 1
            arm.accepted += agreed
    changes = [
        (change.changed_at, str(change.changed_by or "someone since deleted"), *pair)
        for change in queue.routing_changes.select_related("changed_by")
        if (pair := change.changes.get("auto_apply_threshold"))
    ]
    return AutomationBoard(
        automated=sum(automated.values()),
        undone=undone,
        audit=totals,
        by_day=[AutomationDay(ranked[day], automated[day], audits[day]) for day in days],
        thresholds=changes,
    )


def _anchoring(queue: Queue, days: list[date]) -> Anchoring:
    since = timezone.make_aware(datetime.combine(days[0], datetime.min.time()))
    first = {
        decision.item_id: decision
        for decision in Decision.objects.filter(
            # Decided once ranked: before, every item is shown shuffled and without confidence.
            item__queue=queue,
            created_at__gte=since,
            generation__ranked_at__isnull=False,
            created_at__gt=F("generation__ranked_at"),
        )
        .first_standing_per_item()
        .select_related("generation")
    }
    tops = {
        candidate.generation_id: candidate
        for candidate in Candidate.objects.filter(
            generation_id__in=[d.generation_id for d in first.values()], rank=1
        )
    }
    kind = kind_of(queue)
    shown, blind = Arm(), Arm()
    for decision in first.values():
        top = tops.get(decision.generation_id)
        if top is None:
            continue  # ranked before ranks were recorded
        arm = blind if decision.generation.blind else shown
        arm.reviewed += 1
        arm.accepted += decision.verdict != Decision.Verdict.NONE_ACCEPTABLE and answer_key(
            decision.final_text
        ) == answer_key(kind.example_text(text=top.text, fields=top.fields))
    return Anchoring(
        shown=shown,
        blind=blind,
        words=compare(
            shown,
            blind,
            effect="What the order adds",
            names=("shown first", "blind"),
            blocked=None
            if queue.blind_percent
            else "set a blind share in the routing rules: with none, no more items are shown "
            "blind to compare with.",
        ),
    )


def queue_calls(*, queue: Queue) -> QuerySet[Call]:
    """The queue's gateway calls, newest first."""
    return Call.objects.filter(queue=queue).order_by("-created_at", "-pk")


def queue_model_pace(*, queue: Queue) -> Pace | None:
    """The pace of the queue's model over its gateway calls, as the gateway reads it now."""
    return queue_pace(queue.pk)


def call_log_journal(*, user: AnyUser) -> JournalState | None:
    """How the call log's journal stands, across every queue: for admins only (None for
    anyone else), who alone act on it (its dead letters are handled on the command line)."""
    if not is_admin(user):
        return None
    return journal_state()


def queue_dashboard(*, queue: Queue) -> Dashboard:
    today = timezone.localdate()
    days = [today - timedelta(days=offset) for offset in range(DAYS - 1, -1, -1)]
    totals, by_day, by_count = _decisions(queue, days)
    return Dashboard(
        days=days,
        totals=totals,
        by_day=by_day,
        by_count=by_count,
        memory=_memory(queue, days),
        retrieval=_retrieval(queue, days),
        serving=_serving(queue, days),
        holdout=_holdout(queue, days),
        automation=_automation(queue, days),
        rewards=_rewards(queue, days),
        anchoring=_anchoring(queue, days),
    )
