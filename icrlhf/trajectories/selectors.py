"""What the trajectory pages show."""

import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from django.contrib.auth import get_user_model
from django.db.models import (
    Case,
    Count,
    Expression,
    F,
    FloatField,
    IntegerField,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Value,
    When,
)
from django.db.models.functions import Coalesce
from django.utils import formats, timezone

from icrlhf.memory import repeats
from icrlhf.memory.models import Example
from icrlhf.queues.models import Queue
from icrlhf.trajectories.models import Feedback, Step, Trajectory
from icrlhf.trajectories.rewards import learnt_reward
from icrlhf.trajectories.turns import step_turns

PAGE_SIZE = 50
# The call log's page size (insights.views.CALLS_PER_PAGE: a layer above, so not imported),
# to link a step to the page of the log its call is on.
CALL_LOG_PAGE_SIZE = 50
# A reviewer's outcome is feedback without a token, keyed "reviewer:<user id>:<uuid>".
REVIEWER_KEY = "reviewer"
# Runs whose feedback may have effects: no approval asked, or a reviewer approved.
APPROVAL_ALLOWS_MEMORY = (Trajectory.Approval.NOT_NEEDED, Trajectory.Approval.APPROVED)


def low_reward_q(step: str, bar: Expression | F | float) -> Q:
    """Steps (reached through the `step` prefix, e.g. "step__" from a call, "" from a Step)
    rewarded below `bar`: their own reward, their run's, or a run reported failed."""
    return (
        Q(**{f"{step}reward__lt": bar})
        | Q(**{f"{step}trajectory__reward__lt": bar})
        | Q(
            **{
                f"{step}trajectory__reward__isnull": True,
                f"{step}trajectory__outcome": Trajectory.Outcome.FAILED,
            }
        )
    )


@dataclass(frozen=True)
class LowRewardCaptures:
    low: int  # steps rewarded below the bar (with a call to review)
    sent: int  # of them, sent to review
    cap: int

    @property
    def cut(self) -> bool:
        """The queue's cap per run left some of them out."""
        return self.low > self.sent and self.sent >= self.cap


def low_reward_captures_of(trajectory: Trajectory) -> LowRewardCaptures | None:
    """How many of the run's low-reward steps went to review, where the queue sends them."""
    queue = trajectory.queue
    if not queue.capture_low_reward or queue.reward_threshold is None:
        return None
    steps = trajectory.steps.filter(call__isnull=False, call__status_code=200)
    low = steps.filter(low_reward_q("", queue.reward_threshold))
    return LowRewardCaptures(
        low=low.count(),
        sent=steps.filter(call__capture="low_reward").count(),
        cap=queue.low_reward_captures_per_run,
    )


def _latest_learnt_reward() -> Subquery:
    """A run's reward as its page states it (run_summary): what its latest feedback on the
    whole run says, a reward or success as 1 and failure as 0."""
    said = (
        Feedback.objects.filter(trajectory=OuterRef("pk"), step__isnull=True)
        .exclude(reward__isnull=True, success__isnull=True)
        .order_by("-created_at", "-pk")
        .annotate(
            learnt=Case(
                When(reward__isnull=False, then=F("reward")),
                When(success=True, then=Value(1.0)),
                default=Value(0.0),
                output_field=FloatField(),
            )
        )
        .values("learnt")[:1]
    )
    return Subquery(said, output_field=FloatField())


def trajectories_recent(
    *, queue: Queue, outcome: str | None = None, awaiting_approval: bool = False
) -> QuerySet[Trajectory]:
    """The queue's trajectories, the latest step first (optionally of one outcome, or those
    awaiting a reviewer's approval), each with its owner's token and `stated_reward`: the
    reward its page states (the latest feedback's; a curator's in the admin without any)."""
    found = (
        Trajectory.objects.filter(queue=queue)
        .select_related("token")
        .annotate(stated_reward=Coalesce(_latest_learnt_reward(), F("reward")))
    )
    if outcome is not None:
        found = found.filter(outcome=outcome)
    if awaiting_approval:
        found = found.filter(approval=Trajectory.Approval.PENDING)
    return found


def steps_of(trajectory: Trajectory) -> QuerySet[Step]:
    """The run's steps in order, each with its call (whose `item_id` is its review item, when
    it was captured), the examples memory keeps of it, and `call_log_page`: the page of the
    queue's call log its call is on (newest first)."""
    # Through the queue's relation: this app does not import the gateway's models.
    newer = (
        trajectory.queue.calls.filter(
            Q(created_at__gt=OuterRef("call__created_at"))
            | Q(created_at=OuterRef("call__created_at"), pk__gt=OuterRef("call__pk"))
        )
        .order_by()
        .values("queue")
        .annotate(n=Count("pk"))
        .values("n")
    )
    return (
        trajectory.steps.select_related("call")
        .prefetch_related("examples")
        .annotate(
            call_log_page=Coalesce(Subquery(newer, output_field=IntegerField()), 0)
            / CALL_LOG_PAGE_SIZE
            + 1
        )
        .order_by("position", "pk")
    )


@dataclass(frozen=True)
class RepeatedCall:
    """A step that calls a tool again with the same arguments after the run already had that
    call's result: a loop (memory never teaches one, `memory.repeats`)."""

    name: str  # the function called again
    # The position of the step that made the call first; None when the call was already in
    # the conversation the run began with.
    first_position: int | None

    @property
    def text(self) -> str:
        if self.first_position is None:
            return (
                f"Repeats a call to {self.name} with the same arguments, already answered in "
                "the conversation the run began with: a loop."
            )
        return (
            f"Repeats step {self.first_position + 1}'s call to {self.name} with the same "
            "arguments, whose result the run already had: a loop."
        )


def repeated_calls_of(steps: Sequence[Step]) -> dict[int, RepeatedCall]:
    """The run's steps (given in order) whose tool call repeats one the run already made and
    got the result of, by the step's primary key, each with the earliest step that made it."""
    made_by: dict[int, int] = {}  # each step's position, by its action's index in the turns
    found: dict[int, RepeatedCall] = {}
    for turns in step_turns(steps):
        repeated = repeats.repeated_calls(turns.step.tool_calls, turns.before)
        if repeated:
            key, index = min(repeated.items(), key=lambda pair: pair[1])
            found[turns.step.pk] = RepeatedCall(key.name, made_by.get(index))
        made_by[len(turns.before)] = turns.step.position
    return found


class Source(StrEnum):
    APPLICATION = "application"  # feedback with a token: the application's
    PERSON = "person"  # feedback without one, from a reviewer's Succeeded / Failed
    ADMIN = "admin"  # the run's field, set by a curator in the admin
    UNKNOWN = "unknown"  # feedback whose token and key are gone (retention)


@dataclass(frozen=True)
class Said:
    """Who said something about a run, and when (None: in the admin, which keeps no time)."""

    source: Source
    name: str  # the token's name, or the person's username; "" when not known
    at: datetime | None = None

    def __str__(self) -> str:
        if self.source == Source.APPLICATION:
            named = f"token “{self.name}”" if self.name else "a token since deleted"
            return f"the application ({named})"
        if self.source == Source.PERSON:
            return f"{self.name} (a reviewer)" if self.name else "a reviewer"
        if self.source == Source.ADMIN:
            return "a curator in the admin"
        return "someone no longer known (retention removed the record's details)"

    @property
    def when(self) -> str:
        return "" if self.at is None else ", " + _moment(self.at)


def _moment(at: datetime) -> str:
    return formats.date_format(timezone.localtime(at), "M j, H:i")


def reviewer_key(user_id: int) -> str:
    """The key of a reviewer's outcome: each press its own (a change of mind counts)."""
    return f"{REVIEWER_KEY}:{user_id}:{uuid.uuid4()}"


def _reviewer_id(feedback: Feedback) -> int | None:
    kind, _, rest = feedback.key.partition(":")
    user_id = rest.partition(":")[0]
    if feedback.token_id is not None or kind != REVIEWER_KEY or not user_id.isdigit():
        return None
    return int(user_id)


def _said(feedback: Feedback, names: dict[int, str]) -> Said:
    if feedback.token is not None:
        return Said(Source.APPLICATION, feedback.token.name, feedback.created_at)
    if feedback.key.startswith(f"{REVIEWER_KEY}:"):
        user_id = _reviewer_id(feedback)
        name = names.get(user_id, "") if user_id is not None else ""
        if not name and feedback.comment.startswith("Outcome set by "):  # before user ids
            name = feedback.comment.removeprefix("Outcome set by ").removesuffix(".")
        return Said(Source.PERSON, name, feedback.created_at)
    if feedback.key.startswith("purged:"):  # retention blanked its key and comment
        return Said(Source.UNKNOWN, "", feedback.created_at)
    return Said(Source.APPLICATION, "", feedback.created_at)  # its token was deleted since


class Memory(StrEnum):
    NO_RULE = "no_rule"  # the queue has no reward rule: nothing reaches memory
    NO_REWARD = "no_reward"  # no feedback with a reward or success yet
    PENDING = "pending"  # rewarded, awaiting a reviewer's approval
    DECLINED = "declined"  # a reviewer kept its feedback out of memory
    STORED = "stored"  # its steps are memory (approved, or no approval asked)
    NOTHING_STORED = "nothing_stored"  # rewarded and allowed, yet no step is in memory


@dataclass(frozen=True)
class Stored:
    """Steps of the run that memory keeps with one role and reward."""

    role: str  # Example.Role
    reward: float
    steps: int


ROLE_ORDER: dict[str, int] = {Example.Role.PREFERRED: 0, Example.Role.REJECTED: 1}


def _stored_text(stored: Sequence[Stored]) -> str:
    return "; ".join(f"{s.steps} {s.role}, reward {s.reward:.2f}" for s in stored)


def _stored_of(examples: Sequence[Example]) -> tuple[Stored, ...]:
    counts = Counter((e.role, e.reward) for e in examples)
    return tuple(
        Stored(role=role, reward=reward, steps=n)
        for (role, reward), n in sorted(
            counts.items(), key=lambda kv: (ROLE_ORDER.get(kv[0][0], 2), -kv[0][1])
        )
    )


def _steps(n: int) -> str:
    return f"{n} step{'' if n == 1 else 's'}"


@dataclass(frozen=True)
class RunSummary:
    """One run's outcome, reward and memory as its page states them, each with where it came
    from: one set of facts, so the page never contradicts itself."""

    outcome: str  # Trajectory.Outcome
    outcome_said: Said | None
    reward: float | None  # the latest feedback's on the whole run (success: 1, failure: 0)
    reward_from_outcome: bool  # that feedback gave success and no reward
    reward_said: Said | None
    threshold: float | None  # the queue's reward rule: preferred at or above it
    memory: Memory
    stored: tuple[Stored, ...]  # what memory keeps of the run's steps, by role and reward
    retired: int  # of them, retired by curation (retrieval skips them)
    step_count: int
    approval: str  # Trajectory.Approval
    approved_by: str
    approved_at: datetime | None

    @property
    def stored_steps(self) -> int:
        return sum(s.steps for s in self.stored)

    @property
    def preferred(self) -> int:
        return sum(s.steps for s in self.stored if s.role == Example.Role.PREFERRED)

    @property
    def rejected(self) -> int:
        return sum(s.steps for s in self.stored if s.role == Example.Role.REJECTED)

    @property
    def role_for_reward(self) -> str | None:
        """What the run's reward makes its steps under the queue's rule."""
        if self.reward is None or self.threshold is None:
            return None
        return Example.Role.PREFERRED if self.reward >= self.threshold else Example.Role.REJECTED

    @property
    def outcome_line(self) -> str:
        label = Trajectory.Outcome(self.outcome).label
        if self.outcome_said is None:
            return f"{label.capitalize()}: no feedback has said how it ended."
        return f"{label.capitalize()}, said by {self.outcome_said}{self.outcome_said.when}."

    @property
    def reward_line(self) -> str:
        if self.reward is None or self.reward_said is None:
            return "None yet."
        if self.reward_from_outcome:
            ended = "succeeded" if self.reward else "failed"
            return (
                f"{self.reward:.2f}: {self.reward_said} said it {ended} (success counts as 1, "
                f"failure as 0){self.reward_said.when}."
            )
        return f"{self.reward:.2f}, from {self.reward_said}{self.reward_said.when}."

    @property
    def memory_line(self) -> str:
        kept = self._kept()
        if self.memory == Memory.NO_RULE:
            return (
                "Nothing: this queue has no reward rule (its routing page sets one), so "
                "feedback stays on the run." + (f" Stored before: {kept}." if kept else "")
            )
        if self.memory == Memory.NO_REWARD:
            return "Nothing yet: no feedback has rewarded this run."
        if self.memory == Memory.PENDING:
            if not kept:
                return f"Nothing yet: awaiting approval. {self._would_store()}"
            return f"Awaiting approval; already in memory: {kept}. {self._would_store()}"
        decided = f" by {self.approved_by}" if self.approved_by else ""
        if self.approved_at is not None:
            decided += f", {_moment(self.approved_at)}"
        if self.memory == Memory.DECLINED:
            return f"Declined{decided}: its feedback was kept out of memory." + (
                f" Already in memory from earlier feedback: {kept}." if kept else ""
            )
        approved = f"Approved{decided}. " if self.approval == Trajectory.Approval.APPROVED else ""
        if self.memory == Memory.NOTHING_STORED:
            return f"{approved}None of its steps is in memory."
        return f"{approved}Stored as memory: {kept}.{self._first_reward_stands()}"

    def _kept(self) -> str:
        """What memory keeps of the run's steps: "2 steps (2 rejected, reward 0.10)"."""
        if not self.stored:
            return ""
        text = f"{_steps(self.stored_steps)} ({_stored_text(self.stored)}"
        if self.retired:
            text += f"; {self.retired} since retired (by a curator, or replaced by a correction)"
        return text + ")"

    def _first_reward_stands(self) -> str:
        """Why memory's reward differs from the run's, when it does."""
        other = sorted({s.reward for s in self.stored if s.reward != self.reward})
        if self.reward is None or not other:
            return ""
        rewards = ", ".join(f"{r:.2f}" for r in other)
        return (
            f" A step keeps the first reward that reaches memory: reward {rewards} came from "
            f"other feedback than the run's latest ({self.reward:.2f})."
        )

    def _would_store(self) -> str:
        role = self.role_for_reward
        if role is None:
            return "Approved, its rewarded steps become memory."
        new = self.step_count - self.stored_steps
        if new <= 0:
            return (
                "Approved, nothing new would be stored: a step keeps the first reward that "
                "reaches memory."
            )
        side = "at or above" if role == Example.Role.PREFERRED else "below"
        other = "the other " if self.stored else ""
        return (
            f"Approved, {other}{_steps(new)} would be stored as {role} (reward "
            f"{self.reward:.2f}, {side} the queue's bar, {self.threshold:.2f})."
        )


def run_summary(trajectory: Trajectory) -> RunSummary:
    """What the run's page states: its outcome and reward, who gave each (the latest feedback
    on the whole run that says it; a curator's in the admin when none does), and what memory
    keeps of its steps and why."""
    queue = trajectory.queue
    said = list(
        trajectory.feedback.filter(step__isnull=True)
        .exclude(reward__isnull=True, success__isnull=True)
        .select_related("token")
        .order_by("-created_at", "-pk")  # as approval reads them: the latest is stored
    )
    reviewer_ids = {pk for each in said if (pk := _reviewer_id(each)) is not None}
    names = {
        user.pk: user.get_username()
        for user in get_user_model().objects.filter(pk__in=reviewer_ids)
    }

    outcome_said: Said | None = None
    told = next((each for each in said if each.success is not None), None)
    told_outcome = None
    if told is not None:
        told_outcome = Trajectory.Outcome.SUCCEEDED if told.success else Trajectory.Outcome.FAILED
    if told is not None and told_outcome == trajectory.outcome:
        outcome_said = _said(told, names)
    elif trajectory.outcome or told is not None:  # changed in the admin since
        outcome_said = Said(Source.ADMIN, "")

    latest = said[0] if said else None
    reward, reward_said, from_outcome = None, None, False
    if latest is not None:
        reward = learnt_reward(reward=latest.reward, success=latest.success)
        reward_said, from_outcome = _said(latest, names), latest.reward is None
    elif trajectory.reward is not None:
        reward, reward_said = trajectory.reward, Said(Source.ADMIN, "")

    examples = list(
        Example.objects.filter(step__trajectory=trajectory).only("role", "reward", "status")
    )
    retired = sum(e.status == Example.Status.RETIRED for e in examples)
    stored = _stored_of(examples)
    rewarded = latest is not None or trajectory.steps.filter(feedback__isnull=False).exists()
    if queue.reward_threshold is None:
        memory = Memory.NO_RULE
    elif trajectory.approval == Trajectory.Approval.PENDING:
        memory = Memory.PENDING
    elif trajectory.approval == Trajectory.Approval.DECLINED:
        memory = Memory.DECLINED
    elif stored:
        memory = Memory.STORED
    elif not rewarded:
        memory = Memory.NO_REWARD
    else:
        memory = Memory.NOTHING_STORED
    return RunSummary(
        outcome=trajectory.outcome,
        outcome_said=outcome_said,
        reward=reward,
        reward_from_outcome=from_outcome,
        reward_said=reward_said,
        threshold=queue.reward_threshold,
        memory=memory,
        stored=stored,
        retired=retired,
        step_count=trajectory.step_count,
        approval=trajectory.approval,
        approved_by=trajectory.approved_by.get_username() if trajectory.approved_by else "",
        approved_at=trajectory.approved_at,
    )


def approval_report(*, trajectory: Trajectory, stored: Sequence[Example]) -> str:
    """What an approval stored, and why not when it stored nothing."""
    if stored:
        already = Example.objects.filter(step__trajectory=trajectory).count() - len(stored)
        text = f"Approved: {_steps(len(stored))} stored as memory ("
        groups = _stored_of(stored)
        if len(groups) == 1:
            text += f"{groups[0].role}, reward {groups[0].reward:.2f})."
        else:
            text += _stored_text(groups) + ")."
        if already > 0:
            text += f" {_steps(already)} {'was' if already == 1 else 'were'} already in memory."
        return text
    why = "no feedback on it carries a reward"
    if trajectory.queue.reward_threshold is None:
        why = "the queue has no reward rule"
    elif not trajectory.steps.exists():
        why = "the run has no steps"
    elif not trajectory.steps.filter(examples__isnull=True).exists():
        why = "every step was already in memory from earlier feedback"
    return f"Approved, but nothing was stored: {why}."
