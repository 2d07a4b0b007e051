from datetime import date, datetime, time
from typing import Any

from django import forms
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.shortcuts import render
from django.utils import timezone

from icrlhf.accounts.requests import PageRequest
from icrlhf.export.formats import FORMATS
from icrlhf.export.selectors import ExportFilters, ExportSize, export_size
from icrlhf.export.services import export_lines
from icrlhf.export.trajectories import (
    TRAJECTORY_FORMATS,
    TrajectoryFilters,
    trajectory_export_lines,
)
from icrlhf.queues.access import Role, curates_any, is_admin, queues_with_role
from icrlhf.queues.models import Queue
from icrlhf.review.models import Decision


class ExportForm(forms.Form):
    format = forms.ChoiceField(choices=[(f, f) for f in FORMATS])
    queue = forms.ModelChoiceField(
        queryset=Queue.objects.none(), required=False, empty_label="All queues"
    )
    decided_from = forms.DateField(
        required=False, label="Decided from", widget=forms.DateInput(attrs={"type": "date"})
    )
    decided_to = forms.DateField(
        required=False,
        label="Decided until (inclusive)",
        widget=forms.DateInput(attrs={"type": "date"}),
    )
    reviewer = forms.CharField(required=False, max_length=150)
    verdict = forms.ChoiceField(required=False, choices=[("", "Any"), *Decision.Verdict.choices])
    since_last_export = forms.BooleanField(
        required=False, label="Only decided since my last export"
    )
    anonymize = forms.BooleanField(
        required=False, label="Drop reviewer and customer names and redact personal data"
    )

    def __init__(self, *args: Any, user: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["queue"].queryset = queues_with_role(user, Role.CURATOR)  # type: ignore[attr-defined]


class TrajectoryExportForm(forms.Form):
    format = forms.ChoiceField(choices=[(f, f) for f in TRAJECTORY_FORMATS])
    queue = forms.ModelChoiceField(
        queryset=Queue.objects.none(), required=False, empty_label="All queues"
    )
    outcome = forms.ChoiceField(
        required=False,
        choices=[
            ("", "Any"),
            ("succeeded", "Succeeded"),
            ("failed", "Failed"),
            ("open", "Not known"),
        ],
    )
    anonymize = forms.BooleanField(
        required=False, label="Drop the runs' keys and redact personal data"
    )

    def __init__(self, *args: Any, user: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["queue"].queryset = queues_with_role(user, Role.CURATOR)  # type: ignore[attr-defined]


def _day_start(day: date | None) -> datetime | None:
    return timezone.make_aware(datetime.combine(day, time.min)) if day else None


def _allowed_queue_ids(user: Any) -> frozenset[int] | None:
    if is_admin(user):
        return None
    return frozenset(queues_with_role(user, Role.CURATOR).values_list("pk", flat=True))


def _filters(data: dict[str, Any], user: Any) -> ExportFilters:
    until = data["decided_to"]
    return ExportFilters(
        queue=data["queue"],
        allowed_queue_ids=_allowed_queue_ids(user),
        decided_from=_day_start(data["decided_from"]),
        decided_to=_day_start(until.fromordinal(until.toordinal() + 1)) if until else None,
        reviewer=data["reviewer"].strip(),
        verdict=data["verdict"],
        since_last_export=data["since_last_export"],
        anonymize=data["anonymize"],
    )


def _consumer(request: HttpRequest) -> str:
    return f"user:{request.user.get_username()}"


def _size(request: HttpRequest, form: ExportForm) -> ExportSize | None:
    """How many records the form's filters export; None while they are invalid."""
    if not form.is_valid():
        return None
    data = form.cleaned_data
    return export_size(
        fmt=data["format"], filters=_filters(data, request.user), consumer=_consumer(request)
    )


def export_page(request: PageRequest) -> HttpResponseBase:
    """Curators download an export; it streams, so its size does not matter. The page counts
    what the chosen filters export as they change (htmx asks for the count alone)."""
    if not curates_any(request.user):
        raise PermissionDenied("Only curators and admins export, each the queues they curate.")
    if request.method == "GET" and request.htmx:
        form = ExportForm(request.GET, user=request.user)
        context = {"form": form, "size": _size(request, form)}
        return render(request, "export/page.html#size", context)
    form = ExportForm(request.POST or None, user=request.user)
    if request.method != "POST" or not form.is_valid():
        # Unposted, the form's first choices: every decision of the user's queues, canonical.
        shown = form if form.is_bound else ExportForm({"format": FORMATS[0]}, user=request.user)
        context = {"form": form, "size": _size(request, shown)}
        return render(request, "export/page.html", context, status=400 if form.errors else 200)
    data = form.cleaned_data
    lines = export_lines(
        fmt=data["format"], filters=_filters(data, request.user), consumer=_consumer(request)
    )
    return _download(lines, data["format"])


def _download(lines: Any, name: str) -> StreamingHttpResponse:
    response = StreamingHttpResponse(lines, content_type="application/x-ndjson")
    stamp = timezone.now().strftime("%Y%m%d-%H%M")
    response["Content-Disposition"] = f'attachment; filename="icrlhf-{name}-{stamp}.jsonl"'
    return response


def trajectory_export_page(request: HttpRequest) -> HttpResponseBase:
    """Curators download their queues' agent runs, streamed."""
    if not curates_any(request.user):
        raise PermissionDenied("Only curators and admins export, each the queues they curate.")
    form = TrajectoryExportForm(request.POST or None, user=request.user)
    if request.method != "POST" or not form.is_valid():
        status = 400 if form.errors else 200
        return render(request, "export/trajectories.html", {"form": form}, status=status)
    data = form.cleaned_data
    filters = TrajectoryFilters(
        queue=data["queue"],
        allowed_queue_ids=_allowed_queue_ids(request.user),
        outcome=data["outcome"],
        anonymize=data["anonymize"],
    )
    lines = trajectory_export_lines(
        fmt=data["format"], filters=filters, consumer=_consumer(request)
    )
    return _download(lines, f"trajectories-{data['format']}")
