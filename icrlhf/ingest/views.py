from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from icrlhf.ingest.importing import MAX_BYTES, ImportFileError, ImportReport, tickets_import
from icrlhf.queues.access import can_curate, queue_for_member


def ticket_import(request: HttpRequest, slug: str) -> HttpResponse:
    queue = queue_for_member(request.user, slug=slug)
    if not can_curate(request.user, queue):
        raise PermissionDenied("Only this queue's curators and admins import tickets into it.")
    report: ImportReport | None = None
    error = ""
    if request.method == "POST":
        upload = request.FILES.get("file")
        if upload is None:
            error = "Choose a .csv or .jsonl file to import."
        elif upload.size and upload.size > MAX_BYTES:
            error = f"The file is larger than {MAX_BYTES // (1024 * 1024)} MB."
        else:
            try:
                report = tickets_import(queue=queue, data=upload.read(), filename=upload.name or "")
            except ImportFileError as problem:
                error = str(problem)
    status = 400 if error else 200
    context = {"queue": queue, "report": report, "error": error}
    return render(request, "ingest/import.html", context, status=status)
