"""What an export will hold, counted before it is written: the same filters as the export
(services.decisions_filtered), and the lines each format derives from a decision (as
formats.derive writes them) counted in the database, not by building the records."""

from dataclasses import dataclass

from django.db.models import Case, Count, F, IntegerField, OuterRef, Q, Subquery, Sum, Value, When
from django.db.models.functions import Coalesce

from icrlhf.export.formats import FORMATS
from icrlhf.export.services import ExportFilters, decisions_filtered
from icrlhf.generation.models import Candidate
from icrlhf.review.models import Decision


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
