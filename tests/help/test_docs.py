"""Findable: the API docs and the help (the user-facing pages of docs/, read in the app) are in
the navigation, what said "see the README" links to its page and heading, and every link
between the docs' pages resolves."""

import re
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from markdown.extensions.toc import slugify

from icrlhf.help.docs import PAGES, help_pages
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]

REVIEWERS = """# The reviewer's guide

The intro, see [the API](api.md), [its webhook](api.md#the-webhook), [a heading
here](#the-workbench), [the benchmarks](benchmarks.md#the-pipeline), [what
changed](../CHANGELOG.md) and [litellm](https://docs.litellm.ai/).

![A figure](figure.png)

<img src="phone.png" alt="On a phone" width="260">

## Using it

```
## not a heading: inside a fence
```

## The workbench

### Keys

| a | b |
|---|---|
| 1 | 2 |
"""

API = """# The API

## The webhook

Back to [using it](reviewers.md#using-it).
"""


def test_the_navigation_links_the_api_docs_and_the_help(logged_in: Client) -> None:
    page = logged_in.get("/").content.decode()
    nav = page.split('<nav aria-label="Main">')[1].split("</nav>")[0]
    assert '<a href="/api/v1/docs">API docs</a>' in nav
    assert '<a href="/help/">Help</a>' in nav


def test_each_docs_page_is_a_help_page_and_links_between_them_lead_there(
    tmp_path: Path,
) -> None:
    (tmp_path / "reviewers.md").write_text(REVIEWERS)
    (tmp_path / "api.md").write_text(API)
    (tmp_path / "benchmarks.md").write_text("# Benchmarks\n\n## The pipeline\n\n$ bench\n")
    pages = help_pages(folder=tmp_path)
    # In reading order, and only the user-facing pages: never the benchmarks.
    assert [(p.slug, p.title) for p in pages] == [
        ("reviewers", "The reviewer's guide"),
        ("api", "The API"),
    ]
    reviewers, api = pages
    assert 'href="/help/api/"' in reviewers.html
    assert 'href="/help/api/#the-webhook"' in reviewers.html
    assert 'href="#the-workbench"' in reviewers.html
    assert 'href="https://docs.litellm.ai/"' in reviewers.html
    # Files the help does not render are named, not linked; figures too.
    assert "benchmarks.md" not in re.findall(r'href="([^"]*)"', reviewers.html)
    assert "the benchmarks (<code>docs/benchmarks.md</code> in the repository)" in reviewers.html
    assert "what\nchanged (<code>CHANGELOG.md</code> in the repository)" in reviewers.html
    assert "<img" not in reviewers.html
    assert "docs/figure.png" in reviewers.html and "docs/phone.png" in reviewers.html
    # The title is the template's h1; the page's own headings keep their levels.
    assert "<h1" not in reviewers.html
    assert "## not a heading" in reviewers.html  # a fence is not a heading
    assert '<h2 id="the-workbench">The workbench</h2>' in reviewers.html
    assert '<h3 id="keys">Keys</h3>' in reviewers.html
    assert "<table>" in reviewers.html
    assert reviewers.subtitles == (("using-it", "Using it"), ("the-workbench", "The workbench"))
    assert 'href="/help/reviewers/#using-it"' in api.html
    assert help_pages(folder=tmp_path / "missing") == []


def test_every_help_page_of_the_real_docs_opens(logged_in: Client) -> None:
    index = logged_in.get("/help/").content.decode()
    pages = help_pages()
    assert [f"{page.slug}.md" for page in pages] == list(PAGES)
    for page in pages:
        assert f'href="/help/{page.slug}/"' in index
        response = logged_in.get(f"/help/{page.slug}/")
        assert response.status_code == 200, page.slug
        html = response.content.decode()
        assert f"<h1>{page.title}</h1>".replace("'", "&#x27;") in html
        for anchor, _title in page.subtitles:
            assert f'id="{anchor}"' in html, (page.slug, anchor)
    assert logged_in.get("/help/no-such-page/").status_code == 404


def test_every_link_between_help_pages_reaches_its_heading() -> None:
    pages = {page.slug: page for page in help_pages()}
    broken = []
    for page in pages.values():
        for href in re.findall(r'href="((?:/help/[^"#]*)?#[^"]*)"', page.html):
            path, _hash, anchor = href.partition("#")
            slug = path.removeprefix("/help/").removesuffix("/") if path else page.slug
            target = pages.get(slug)
            if target is None or f'id="{anchor}"' not in target.html:
                broken.append(f"{page.slug}: {href}")
    assert broken == []


def test_the_help_shows_no_benchmark_logs_or_ci_times(logged_in: Client) -> None:
    assert "benchmarks.md" not in PAGES and "README.md" not in PAGES
    for page in help_pages():
        links = re.findall(r'href="([^"]*)"', page.html)
        assert not [link for link in links if link.endswith(".md") or ".md#" in link], page.slug
        assert "$ manage.py bench_" not in page.html, page.slug
        assert "<img" not in page.html, page.slug
        assert "this release" not in page.html, page.slug
        assert not re.search(r"\d+ min \d+ s", page.html), page.slug


def test_a_link_to_an_old_readme_section_leads_to_its_new_place(logged_in: Client) -> None:
    moved = {
        "/help/overview/": "/help/",
        "/help/the-api/": "/help/api/",
        "/help/exporting-preferences/": "/help/exports/#exporting-preferences",
        "/help/configuration/": "/help/operators/#configuration",
        "/help/the-two-commands/": "/help/operators/#the-two-commands",
        "/help/support-triage/": "/help/reviewers/#support-triage",
    }
    for old, new in moved.items():
        response = logged_in.get(old)
        assert (response.status_code, response["Location"]) == (301, new), old
    # The benchmarks are not help: their old sections are gone from it.
    assert logged_in.get("/help/benchmark-the-gateway/").status_code == 404


def test_an_install_without_docs_says_so(logged_in: Client, settings: Any, tmp_path: Path) -> None:
    settings.BASE_DIR = tmp_path
    index = logged_in.get("/help/").content.decode()
    assert "This install has no <code>docs/</code> folder" in index
    assert logged_in.get("/help/reviewers/").status_code == 404


def test_help_needs_a_login(client: Client) -> None:
    assert client.get("/help/").status_code == 302
    assert client.get("/help/api/").status_code == 302


def help_links(html: str) -> list[str]:
    return re.findall(r'href="(/help/[^"]*)"', html)


def test_what_said_see_the_readme_links_to_its_page_and_heading(queue: Any) -> None:
    curator = Client()
    curator.force_login(UserFactory())
    queue.members.add(curator.session["_auth_user_id"], through_defaults={"role": "curator"})
    pages = {
        "export": curator.get("/export/").content.decode(),
        "trajectories export": curator.get("/export/trajectories/").content.decode(),
        "dashboard": curator.get(f"/q/{queue.slug}/dashboard/").content.decode(),
        "calls": curator.get(f"/q/{queue.slug}/calls/").content.decode(),
    }
    for name, html in pages.items():
        assert "see the readme" not in html.lower() and "the readme documents" not in html.lower()
        links = [link for link in help_links(html) if link != "/help/"]
        assert links, f"{name} links to no help page"
        for link in links:
            path, _hash, anchor = link.partition("#")
            response = curator.get(path)
            assert response.status_code == 200, (name, link)
            if anchor:
                assert f'id="{anchor}"' in response.content.decode(), (name, link)


FENCED = re.compile(r"^\s*(```|~~~).*?^\s*(```|~~~)", re.MULTILINE | re.DOTALL)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)[^)]*\)|<img\b[^>]*\bsrc=\"([^\"]+)\"")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.MULTILINE)


def anchors(markdown_text: str) -> set[str]:
    text = FENCED.sub("", markdown_text)
    return {slugify(re.sub(r"[`*_]", "", title), "-") for title in HEADING.findall(text)}


def test_every_link_in_the_readme_and_the_docs_resolves() -> None:
    """A relative link names a file of the repository, and its `#anchor` a heading of it (the
    anchors GitHub and the help give headings alike: no heading may need more)."""
    documents = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
    broken = []
    for document in documents:
        text = FENCED.sub("", document.read_text(encoding="utf-8"))
        for match in LINK.finditer(text):
            target = match.group(1) or match.group(2)
            if re.match(r"^[a-z]+:", target):
                continue
            path, _hash, anchor = target.partition("#")
            file = (document.parent / path).resolve() if path else document
            if not file.exists():
                broken.append(f"{document.name}: {target} (no such file)")
            elif anchor and anchor not in anchors(file.read_text(encoding="utf-8")):
                broken.append(f"{document.name}: {target} (no such heading)")
    assert broken == []


def test_the_readme_is_short_and_points_at_every_docs_page() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 300
    assert "![" in readme.split("## ")[0], "a screenshot of the workbench near the top"
    for page in sorted((ROOT / "docs").glob("*.md")):
        assert f"(docs/{page.name}" in readme, page.name


def test_the_api_docs_fit_a_phone_and_lead_back(logged_in: Client) -> None:
    docs = logged_in.get("/api/v1/docs").content.decode()
    assert '<meta name="viewport" content="width=device-width, initial-scale=1">' in docs
    assert "/static/css/api-docs.css" in docs
    assert '<a href="/">&larr; Back to icrlhf</a>' in docs
    root = logged_in.get("/api/v1/")
    assert (root.status_code, root["Location"]) == (302, "/api/v1/docs")
