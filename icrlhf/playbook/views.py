"""The playbook's page: the rules in force, their history, and (for curators) the edits."""

import json

from django.contrib import messages
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from icrlhf.accounts.requests import PageRequest
from icrlhf.playbook import selectors, services
from icrlhf.playbook.forms import EntryForm, ImportForm
from icrlhf.playbook.models import Version
from icrlhf.queues.access import can_curate, queue_for_curator, queue_for_member
from icrlhf.queues.models import Queue

# A playbook of 40 entries of 500 characters is about 25 KB as JSON.
IMPORT_MAX_BYTES = 256 * 1024


def playbook_page(request: HttpRequest, slug: str) -> HttpResponse:
    queue = queue_for_member(request.user, slug=slug)
    return _page(request, queue)


def _page(
    request: HttpRequest,
    queue: Queue,
    *,
    add_form: EntryForm | None = None,
    edit_form: tuple[int, EntryForm] | None = None,
    import_form: ImportForm | None = None,
    status: int = 200,
) -> HttpResponse:
    """`edit_form`: an entry's refused edit (its key and bound form), shown open with what
    was typed and why it was refused."""
    current = selectors.current_version(queue)
    entries = selectors.version_entries(current)
    context = {
        "queue": queue,
        "may_edit": can_curate(request.user, queue),
        "current": current,
        # Each entry with its edit form.
        "sections": [
            (
                section,
                [
                    (
                        e,
                        edit_form[1]
                        if edit_form and edit_form[0] == e.key
                        else EntryForm(
                            initial={"section": e.section, "text": e.text}, prefix=f"e{e.key}"
                        ),
                    )
                    for e in rules
                ],
            )
            for section, rules in selectors.by_section(entries)
        ],
        "add_form": add_form or EntryForm(prefix="new"),
        "import_form": import_form or ImportForm(),
        "history": selectors.versions_history(queue),
    }
    return render(request, "playbook/page.html", context, status=status)


_REFUSAL = "Only the queue's curators and admins change its playbook."


def _saved(request: HttpRequest, queue: Queue, version: Version) -> HttpResponse:
    messages.success(
        request, f"Saved as version {version.number}; the next prompt of the queue carries it."
    )
    return redirect("playbook:page", slug=queue.slug)


@require_POST
def entry_add(request: PageRequest, slug: str) -> HttpResponse:
    queue = queue_for_curator(request.user, refusal=_REFUSAL, slug=slug)
    form = EntryForm(request.POST, prefix="new")
    if form.is_valid():
        try:
            version = services.entry_add(
                queue=queue,
                author=request.user,
                **form.cleaned_data,
            )
        except ValidationError as error:
            form.add_error(None, error)
        else:
            return _saved(request, queue, version)
    return _page(request, queue, add_form=form, status=400)


@require_POST
def entry_edit(request: PageRequest, slug: str, key: int) -> HttpResponse:
    queue = queue_for_curator(request.user, refusal=_REFUSAL, slug=slug)
    form = EntryForm(request.POST, prefix=f"e{key}")
    if form.is_valid():
        try:
            version = services.entry_edit(
                queue=queue, key=key, author=request.user, **form.cleaned_data
            )
        except ValidationError as error:
            form.add_error(None, error)
        else:
            return _saved(request, queue, version)
    return _page(request, queue, edit_form=(key, form), status=400)


@require_POST
def entry_retire(request: PageRequest, slug: str, key: int) -> HttpResponse:
    queue = queue_for_curator(request.user, refusal=_REFUSAL, slug=slug)
    try:
        version = services.entry_retire(queue=queue, key=key, author=request.user)
    except ValidationError as error:
        messages.error(request, " ".join(error.messages))
        return redirect("playbook:page", slug=queue.slug)
    return _saved(request, queue, version)


@require_POST
def version_restore(request: PageRequest, slug: str, number: int) -> HttpResponse:
    queue = queue_for_curator(request.user, refusal=_REFUSAL, slug=slug)
    try:
        version = services.version_restore(queue=queue, number=number, author=request.user)
    except ValidationError as error:
        messages.error(request, " ".join(error.messages))
        return redirect("playbook:page", slug=queue.slug)
    return _saved(request, queue, version)


def playbook_export(request: HttpRequest, slug: str) -> HttpResponse:
    queue = queue_for_member(request.user, slug=slug)
    response = HttpResponse(
        json.dumps(services.playbook_export(queue), indent=2, ensure_ascii=False),
        content_type="application/json",
    )
    response["Content-Disposition"] = f'attachment; filename="{queue.slug}-playbook.json"'
    return response


@require_POST
def playbook_import(request: PageRequest, slug: str) -> HttpResponse:
    queue = queue_for_curator(request.user, refusal=_REFUSAL, slug=slug)
    form = ImportForm(request.POST, request.FILES)
    if form.is_valid():
        upload = form.cleaned_data["file"]
        if upload.size > IMPORT_MAX_BYTES:
            form.add_error(
                "file",
                f"The file has {upload.size:,} bytes; a playbook is at most "
                f"{IMPORT_MAX_BYTES:,}. Nothing was imported.",
            )
        else:
            try:
                version = services.playbook_import(
                    queue=queue,
                    raw=upload.read(),
                    author=request.user,
                )
            except ValidationError as error:
                form.add_error("file", error)
            else:
                return _saved(request, queue, version)
    return _page(request, queue, import_form=form, status=400)
