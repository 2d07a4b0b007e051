from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.safestring import mark_safe
from markdown.extensions.toc import slugify

from icrlhf.help.docs import HelpPage, help_pages, page_for_anchor


def help_index(request: HttpRequest) -> HttpResponse:
    return render(request, "help/index.html", {"pages": help_pages()})


def help_page(request: HttpRequest, slug: str) -> HttpResponse:
    pages = help_pages()
    index = next((i for i, page in enumerate(pages) if page.slug == slug), None)
    if index is None:
        return _moved(slug, pages)
    page = pages[index]
    context = {
        "page": page,
        # The docs ship with the code: as trusted as a template.
        "body": mark_safe(page.html),  # noqa: S308
        "previous": pages[index - 1] if index > 0 else None,
        "next": pages[index + 1] if index + 1 < len(pages) else None,
    }
    return render(request, "help/page.html", context)


def _moved(slug: str, pages: list[HelpPage]) -> HttpResponse:
    """Before docs/, the help was the README split at its `##` headings, one page each: such a
    page (a bookmark, an old link) leads to the heading that holds its text now."""
    if slug == "overview" and pages:
        return redirect("help:index", permanent=True)
    page = page_for_anchor(slug, pages)
    if page is None:
        raise Http404("No such help page.")
    url = reverse("help:page", args=[page.slug])
    return redirect(url if slug == slugify(page.title, "-") else f"{url}#{slug}", permanent=True)
