from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.conf import LazySettings
from django.contrib.auth import authenticate
from django.core.management import call_command

from icrlhf.ops.demo import DEMO_INTENTS, demo_login_ensure, demo_queue_ensure
from icrlhf.playbook.selectors import playbook_in_force
from icrlhf.queues.models import Item, Queue

pytestmark = pytest.mark.django_db


def test_the_demo_login_is_created_once_with_a_kept_password(
    settings: LazySettings, tmp_path: Path
) -> None:
    settings.VAR_DIR = tmp_path
    first = demo_login_ensure()
    assert authenticate(username=first.username, password=first.password) is not None
    assert len(first.password) >= 16
    assert (tmp_path / "demo_password").stat().st_mode & 0o777 == 0o600
    assert demo_login_ensure() == first


def test_the_demo_queue_gets_banking77_items_once(
    settings: LazySettings, tmp_path: Path, django_capture_on_commit_callbacks: Any
) -> None:
    settings.VAR_DIR = tmp_path
    demo_login_ensure()
    with django_capture_on_commit_callbacks(execute=False):
        queue, created = demo_queue_ensure(data_dir=settings.SHARED_DATA_DIR)
        again, created_again = demo_queue_ensure(data_dir=settings.SHARED_DATA_DIR)
    assert (created, created_again, again) == (len(DEMO_INTENTS), 0, queue)
    items = Item.objects.filter(queue=queue)
    assert items.count() == len(DEMO_INTENTS)
    assert all(item.status == Item.Status.GENERATING for item in items)
    assert all(item.generations.get().candidates.count() == 4 for item in items)
    # Its playbook, written once, is what its prompts carry.
    assert playbook_in_force(queue).number == 1
    assert "last four digits" in playbook_in_force(queue).text


def test_without_banking77_seed_demo_says_what_is_missing_and_seeds_once_it_is_there(
    settings: LazySettings, tmp_path: Path, django_capture_on_commit_callbacks: Any
) -> None:
    """A clone without the shared data used to get an empty demo queue and no triage queue,
    and no word of why; the data set put in place later still seeds the queue."""
    settings.VAR_DIR = tmp_path
    shared = settings.SHARED_DATA_DIR
    settings.SHARED_DATA_DIR = tmp_path / "data"
    stdout, stderr = StringIO(), StringIO()
    with django_capture_on_commit_callbacks(execute=False):
        call_command("seed_demo", stdout=stdout, stderr=stderr)
    assert "queue banking-support: 0 new items" in stdout.getvalue()
    warning = stderr.getvalue()
    assert f"No Banking77 data set in {tmp_path / 'data' / 'banking77'}" in warning
    assert "test.csv and categories.json missing" in warning and "SHARED_DATA_DIR" in warning
    assert not Queue.objects.filter(kind=Queue.Kind.TRIAGE).exists()

    settings.SHARED_DATA_DIR = shared
    stdout, stderr = StringIO(), StringIO()
    with django_capture_on_commit_callbacks(execute=False):
        call_command("seed_demo", stdout=stdout, stderr=stderr)
    assert f"{len(DEMO_INTENTS)} new items" in stdout.getvalue()
    assert "Triage queue banking-triage: 8 new tickets" in stdout.getvalue()
    assert stderr.getvalue() == ""
