"""Findable, in a real browser: the export page counts what the filters export as they
change, before anything is downloaded."""

from typing import Any

import pytest
from playwright.sync_api import Browser, expect

from icrlhf.export.models import ExportRun
from icrlhf.review.decisions import decision_record
from tests.factories import ItemFactory, QueueFactory, UserFactory, ready_generation
from tests.support.browser import log_in, new_page

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_the_export_page_counts_live_as_the_filters_change(
    live_server: Any, browser: Browser
) -> None:
    curator = UserFactory()
    queue = QueueFactory(curators=[curator])
    for verdict in ["chosen", "chosen", "none_acceptable"]:
        item = ItemFactory(queue=queue)
        generation = ready_generation(item, ["One answer.", "Another.", "A third."])
        first = generation.candidates.order_by("position")[0]
        decision_record(
            item_id=item.pk,
            reviewer=curator,
            verdict=verdict,
            candidate_id=first.pk if verdict == "chosen" else None,
        )
    page = new_page(browser, width=1366, height=900)
    try:
        log_in(page, live_server.url, curator.username)
        page.goto(f"{live_server.url}/export/")
        size = page.locator("#export-size")
        expect(size).to_have_text("3 records will be exported.")
        page.get_by_label("Format").select_option("trl")
        expect(size).to_have_text("4 records will be exported, from 3 decisions.")
        page.get_by_label("Verdict").select_option("none_acceptable")
        expect(size).to_contain_text("Nothing to export")
        page.get_by_label("Verdict").select_option("")
        page.get_by_label("Reviewer", exact=True).fill(
            "someone-else"
        )  # typed: counted after a pause
        expect(size).to_contain_text("Nothing to export")
        page.get_by_label("Reviewer", exact=True).fill(curator.username)
        expect(size).to_have_text("4 records will be exported, from 3 decisions.")
        assert ExportRun.objects.count() == 0
    finally:
        page.context.close()
