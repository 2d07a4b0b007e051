from pathlib import Path
from typing import Any

import pytest
from django.conf import LazySettings
from django.contrib.auth import authenticate

from icrlhf.ops.demo import DEMO_INTENTS, demo_login_ensure, demo_queue_ensure
from icrlhf.queues.models import Item

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
