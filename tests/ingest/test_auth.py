"""One token check for every API: the token, then its scope, then its limit."""

from typing import Any

import pytest
from django.test import RequestFactory

from icrlhf.ingest.auth import (
    TokenGuessing,
    TokenLimit,
    TokenOverLimit,
    TokenScopeMissing,
    TokenUnknown,
    token_admit,
)
from icrlhf.ingest.models import Scope
from icrlhf.ingest.services import token_create
from tests.factories import QueueFactory

pytestmark = pytest.mark.django_db

ONE_A_MINUTE = TokenLimit("test-token", 1)


def test_a_call_refused_for_its_scope_is_not_counted_against_its_limit() -> None:
    token = token_create(queue=QueueFactory(), name="tickets only", scopes=[Scope.ITEMS])[1]
    request = RequestFactory().get("/")
    for _ in range(3):
        with pytest.raises(TokenScopeMissing):
            token_admit(request=request, token=token, scope=Scope.GATEWAY, limit=ONE_A_MINUTE)
    admitted = token_admit(request=request, token=token, scope=Scope.ITEMS, limit=ONE_A_MINUTE)
    assert admitted.allows(Scope.ITEMS)
    with pytest.raises(TokenOverLimit) as refused:
        token_admit(request=request, token=token, scope=Scope.ITEMS, limit=ONE_A_MINUTE)
    assert 1 <= refused.value.retry_after_s <= 60


def test_an_address_guessing_tokens_is_limited(settings: Any) -> None:
    settings.API_REQUESTS_PER_MINUTE = 2
    request = RequestFactory().get("/")
    for _ in range(2):
        with pytest.raises(TokenUnknown):
            token_admit(request=request, token="icr_guess", scope=Scope.ITEMS, limit=ONE_A_MINUTE)
    with pytest.raises(TokenGuessing):
        token_admit(request=request, token="icr_guess", scope=Scope.ITEMS, limit=ONE_A_MINUTE)
