"""The admin's examples list: what it shows of each example, and the reweight action."""

from typing import Any

import pytest
from django.test import Client

from icrlhf.memory.models import CurationEvent, Example
from tests.factories import UserFactory, stored_example

pytestmark = pytest.mark.django_db


@pytest.fixture
def curator(queue: Any) -> Client:
    client = Client()
    user = UserFactory(is_staff=True)
    queue.members.add(user, through_defaults={"role": "curator"})
    client.force_login(user)
    return client


@pytest.fixture
def preferred_and_rejected(queue: Any) -> tuple[Example, Example]:
    preferred = stored_example(queue, output_text="Use the app to reset it.")
    rejected = Example.objects.create(
        queue=queue,
        decision=preferred.decision,
        role=Example.Role.REJECTED,
        input_text=preferred.input_text,
        output_text="Call us with your card number.",
        reward=0.0,
        weight=1.0,
    )
    Example.objects.filter(pk=preferred.pk).update(weight=1.5)
    return preferred, rejected


def cell(page: str, example: Example, field: str) -> str:
    row = page.split(f'value="{example.pk}"')[1].split("</tr>")[0]
    return row.split(f'class="field-{field}')[1].split(">", 1)[1].split("</td>")[0]


def test_rejected_examples_show_no_weight(
    curator: Client, preferred_and_rejected: tuple[Example, Example]
) -> None:
    preferred, rejected = preferred_and_rejected
    page = curator.get("/admin/memory/example/").content.decode()
    assert cell(page, preferred, "weight_shown") == "1.5"
    assert cell(page, rejected, "weight_shown") == "–"
    assert cell(page, preferred, "status_shown") == "Preferred · Active"
    assert cell(page, rejected, "status_shown") == "Rejected"
    change = curator.get(f"/admin/memory/example/{rejected.pk}/change/").content.decode()
    weight = change.split("field-weight_shown")[1].split('class="readonly">')[1].split("<")[0]
    assert weight == "–"


def test_the_list_leaves_out_the_side_navigation_and_styles_its_weight_box(
    curator: Client, preferred_and_rejected: Any
) -> None:
    page = curator.get("/admin/memory/example/").content.decode()
    assert 'id="nav-sidebar"' not in page  # the list needs the room (1,366 px)
    assert "/static/css/admin.css" in page
    assert '<input type="number" name="weight" step="0.1" min="0"' in page
    # The browser test (test_phone_width) checks it is shown only beside "Reweight".
    assert '<option value="reweight">' in page


def test_reweighting_leaves_rejected_examples_as_they_were_and_says_so(
    curator: Client, preferred_and_rejected: tuple[Example, Example]
) -> None:
    preferred, rejected = preferred_and_rejected
    response = curator.post(
        "/admin/memory/example/",
        {
            "action": "reweight",
            "_selected_action": [str(preferred.pk), str(rejected.pk)],
            "weight": "2",
        },
        follow=True,
    )
    text = response.content.decode()
    assert "Reweighted 1 example(s) to 2. 1 rejected example(s) have no weight" in text
    preferred.refresh_from_db()
    rejected.refresh_from_db()
    assert (preferred.weight, rejected.weight) == (2.0, 1.0)
    assert list(CurationEvent.objects.values_list("action", "example_id")) == [
        ("reweight", preferred.pk)
    ]
