from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils.safestring import mark_safe

from icrlhf.help.readme import help_sections


def help_index(request: HttpRequest) -> HttpResponse:
    return render(request, "help/index.html", {"sections": help_sections()})


def help_page(request: HttpRequest, slug: str) -> HttpResponse:
    sections = help_sections()
    index = next((i for i, section in enumerate(sections) if section.slug == slug), None)
    if index is None:
        raise Http404("No such help page.")
    section = sections[index]
    context = {
        "section": section,
        # The README ships with the code: as trusted as a template.
        "body": mark_safe(section.html),  # noqa: S308
        "previous": sections[index - 1] if index > 0 else None,
        "next": sections[index + 1] if index + 1 < len(sections) else None,
    }
    return render(request, "help/section.html", context)
