"""Findable: the API docs and the help (the README, read in the app) are in the navigation,
and what said "see the README" links to its section."""

import re
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from icrlhf.help.readme import help_sections
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db

README = """# project

The intro, see [the API](#the-api) and [its webhook](#the-webhook).

![A figure](docs/figure.png)

## Using it

```
## not a heading: inside a fence
```

### The workbench

| a | b |
|---|---|
| 1 | 2 |

## The API

### The webhook

Back to [using it](#using-it).
"""


def test_the_navigation_links_the_api_docs_and_the_help(logged_in: Client) -> None:
    page = logged_in.get("/").content.decode()
    nav = page.split('<nav aria-label="Main">')[1].split("</nav>")[0]
    assert '<a href="/api/v1/docs">API docs</a>' in nav
    assert '<a href="/help/">Help</a>' in nav


def test_the_readme_is_split_into_pages_at_its_second_level_headings(tmp_path: Path) -> None:
    path = tmp_path / "README.md"
    path.write_text(README)
    sections = help_sections(path=path)
    assert [(s.slug, s.title) for s in sections] == [
        ("overview", "Overview"),
        ("using-it", "Using it"),
        ("the-api", "The API"),
    ]
    overview, using, api = sections
    # Links to another page's heading go to that page; figures are named, not shown.
    assert 'href="/help/the-api/"' in overview.html
    assert 'href="/help/the-api/#the-webhook"' in overview.html
    assert "<img" not in overview.html and "docs/figure.png" in overview.html
    assert "## not a heading" in using.html  # a fence is not split
    assert '<h2 id="the-workbench">The workbench</h2>' in using.html  # one level up
    assert "<table>" in using.html
    assert using.subtitles == (("the-workbench", "The workbench"),)
    assert 'href="/help/using-it/"' in api.html
    assert help_sections(path=tmp_path / "missing.md") == []


def test_every_help_page_of_the_real_readme_opens(logged_in: Client) -> None:
    index = logged_in.get("/help/").content.decode()
    sections = help_sections()
    assert len(sections) > 10
    for section in sections:
        assert f'href="/help/{section.slug}/"' in index
        page = logged_in.get(f"/help/{section.slug}/")
        assert page.status_code == 200, section.slug
        assert f"<h1>{section.title}</h1>".replace("'", "&#x27;") in page.content.decode()
    assert logged_in.get("/help/no-such-section/").status_code == 404


def test_help_needs_a_login(client: Client) -> None:
    assert client.get("/help/").status_code == 302
    assert client.get("/help/the-api/").status_code == 302


def help_links(html: str) -> list[str]:
    return re.findall(r'href="(/help/[^"#]*)', html)


def test_what_said_see_the_readme_links_to_its_section(queue: Any) -> None:
    curator = Client()
    curator.force_login(UserFactory())
    queue.members.add(curator.session["_auth_user_id"], through_defaults={"role": "curator"})
    pages = {
        "export": curator.get("/export/").content.decode(),
        "dashboard": curator.get(f"/q/{queue.slug}/dashboard/").content.decode(),
        "calls": curator.get(f"/q/{queue.slug}/calls/").content.decode(),
    }
    for name, html in pages.items():
        assert "see the readme" not in html.lower() and "the readme documents" not in html.lower()
        links = [link for link in help_links(html) if link != "/help/"]
        assert links, f"{name} links to no help section"
        for link in links:
            assert curator.get(link).status_code == 200, (name, link)


def test_the_api_docs_fit_a_phone_and_lead_back(logged_in: Client) -> None:
    docs = logged_in.get("/api/v1/docs").content.decode()
    assert '<meta name="viewport" content="width=device-width, initial-scale=1">' in docs
    assert "/static/css/api-docs.css" in docs
    assert '<a href="/">&larr; Back to icrlhf</a>' in docs
    root = logged_in.get("/api/v1/")
    assert (root.status_code, root["Location"]) == (302, "/api/v1/docs")
