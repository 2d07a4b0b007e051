"""What an export will hold, counted before it is written: the same filters as the export
(decisions_filtered, below), and the lines each format derives from a decision (as
formats.derive writes them) counted in the database, not by building the records."""

from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from django.db.models import (
    Case,
    Count,
    F,
    IntegerField,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Sum,
    Value,
    When,
)
from django.db.models.functions import Coalesce

from icrlhf.export.formats import FORMATS
from icrlhf.export.models import ExportRun
from icrlhf.generation.models import Candidate
from icrlhf.queues.models import Queue
from icrlhf.review.models import Decision


@dataclass(frozen=True)
class ExportFilters:
    queue: Queue | None = None
    # The queues the person exporting may export; None for all (admins, the command line).
    # "All queues" means all of these, never every queue of the install.
    allowed_queue_ids: frozenset[int] | None = None
    decided_from: datetime | None = None
    decided_to: datetime | None = None
    reviewer: str = ""
    verdict: str = ""
    since_last_export: bool = False
    anonymize: bool = False

    def __post_init__(self) -> None:
        # In UTC: PostgreSQL refuses offsets beyond ±15:59, which Python (and ISO 8601 as
        # the API parses it) allows, and one time is the same instant either way.
        for name in ("decided_from", "decided_to"):
            value = getattr(self, name)
            if value is not None and value.tzinfo is not None:
                object.__setattr__(self, name, _utc_bound(value))

    def describe(self) -> dict[str, Any]:
        data = asdict(self)
        data["queue"] = self.queue.slug if self.queue else None
        if self.allowed_queue_ids is not None:
            data["allowed_queue_ids"] = sorted(self.allowed_queue_ids)
        return {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in data.items()}


def _utc_bound(value: datetime) -> datetime:
    """A filter bound in UTC; one beyond the calendar in UTC (year 1 at +14:00) is the
    calendar's own end, which filters the same."""
    try:
        return value.astimezone(UTC)
    except OverflowError:
        return (datetime.min if value.year == 1 else datetime.max).replace(tzinfo=UTC)


def decisions_filtered(*, filters: ExportFilters, consumer: str) -> QuerySet[Decision]:
    decisions = Decision.objects.standing()
    if filters.allowed_queue_ids is not None:
        decisions = decisions.filter(item__queue_id__in=filters.allowed_queue_ids)
    if filters.queue is not None:
        decisions = decisions.filter(item__queue=filters.queue)
    if filters.decided_from:
        decisions = decisions.filter(created_at__gte=filters.decided_from)
    if filters.decided_to:
        decisions = decisions.filter(created_at__lt=filters.decided_to)
    if filters.reviewer:
        decisions = decisions.filter(reviewer__username=filters.reviewer)
    if filters.verdict:
        decisions = decisions.filter(verdict=filters.verdict)
    if filters.since_last_export:
        last = ExportRun.objects.filter(
            consumer=consumer, queue=filters.queue, decided_until__isnull=False
        ).first()
        if last is not None and last.decided_until is not None:
            decisions = decisions.filter(created_at__gt=last.decided_until)
    return decisions


@dataclass(frozen=True)
class ExportSize:
    format: str
    records: int  # lines of the file
    decisions: int


def export_size(*, fmt: str, filters: ExportFilters, consumer: str) -> ExportSize:
    if fmt not in FORMATS:
        raise ValueError(f"Unknown format {fmt!r}; choose one of {', '.join(FORMATS)}.")
    decisions = decisions_filtered(filters=filters, consumer=consumer)
    if fmt == "canonical":
        count = decisions.count()
        return ExportSize(format=fmt, records=count, decisions=count)
    answered = Subquery(
        Candidate.objects.filter(
            generation_id=OuterRef("generation_id"), status=Candidate.Status.DONE
        )
        .order_by()
        .values("generation_id")
        .annotate(n=Count("pk"))
        .values("n"),
        output_field=IntegerField(),
    )
    # The chosen candidate, if answered, is the preferred side rather than a rejected one.
    chosen_answered = Case(
        When(
            Q(chosen_candidate__status=Candidate.Status.DONE)
            & Q(chosen_candidate__generation_id=F("generation_id")),
            then=Value(1),
        ),
        default=Value(0),
    )
    chosen, edited = Decision.Verdict.CHOSEN, Decision.Verdict.EDITED
    lines: Case
    if fmt in {"trl", "openai"}:  # a pair per rejected answer, and the edit over its original
        lines = Case(
            When(verdict=chosen, then=F("answered") - chosen_answered),
            When(verdict=edited, then=F("answered")),
            default=Value(0),
        )
    else:  # kto: the final answer labelled true, every other answer false
        lines = Case(
            When(verdict=chosen, then=Value(1) + F("answered") - chosen_answered),
            When(verdict=edited, then=Value(1) + F("answered")),
            default=F("answered"),
        )
    totals = decisions.annotate(answered=Coalesce(answered, Value(0))).aggregate(
        records=Sum(lines, output_field=IntegerField()), decisions=Count("pk")
    )
    return ExportSize(format=fmt, records=totals["records"] or 0, decisions=totals["decisions"])
