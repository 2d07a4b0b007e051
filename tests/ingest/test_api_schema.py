"""Schemathesis generates requests from the API's own OpenAPI schema: none may end in a
server error, whatever the input."""

from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from icrlhf.api import api
from icrlhf.wsgi import application

schema = schemathesis.openapi.from_dict(api.get_openapi_schema(path_prefix="/api/v1"))
schema.app = application


@pytest.fixture(autouse=True)
def _generation_not_started(monkeypatch: pytest.MonkeyPatch) -> None:
    """The items created here are only read back: their generation is not sent to the broker,
    where a worker of the integration tests would work on rows this test's teardown truncates
    (a deadlock on PostgreSQL)."""
    from icrlhf.generation import tasks

    monkeypatch.setattr(tasks.generation_prepare, "apply_async", lambda *args, **kwargs: None)


@pytest.mark.django_db(transaction=True)
@schema.parametrize()
@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_no_input_makes_the_api_fail(case: Any, api_token: str) -> None:
    case.call_and_validate(
        headers={"Authorization": f"Bearer {api_token}"}, checks=[not_a_server_error]
    )


def test_the_api_offers_exactly_the_ticket_priorities_items_store() -> None:
    from typing import get_args

    from icrlhf.ingest.schemas import Priority
    from icrlhf.queues.models import Item

    assert list(get_args(Priority)) == list(Item.Priority.values)
