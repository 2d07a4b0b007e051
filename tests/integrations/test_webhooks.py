"""Webhook URLs are whatever a queue's editor typed (issue 27, item 4): internal addresses
are refused, the request goes to the address that was checked (no DNS rebinding), the
signature covers a timestamp, and the secret is never shown again in the admin."""

import hashlib
import hmac
import ipaddress
import socket
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client

from icrlhf.integrations import webhooks
from icrlhf.queues.admin import QueueAdminForm
from tests.factories import QueueFactory, UserFactory
from tests.support.webhook_receiver import Receiver


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    receiver = Receiver([])
    yield receiver
    receiver.server.shutdown()


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8000/hook",
        "http://localhost/hook",
        "http://10.1.2.3/hook",
        "http://192.168.0.10/hook",
        "http://169.254.169.254/latest/meta-data/",  # a cloud's metadata service
        "http://[::1]/hook",
        "ftp://example.org/hook",
    ],
)
def test_an_internal_address_is_refused(url: str, settings: Any) -> None:
    settings.WEBHOOK_ALLOW_PRIVATE = False
    with pytest.raises(webhooks.WebhookRejectedError):
        webhooks.post_signed(url=url, secret="s", event="item.decided", payload={})


def test_a_public_address_passes_the_check(settings: Any) -> None:
    settings.WEBHOOK_ALLOW_PRIVATE = False
    assert webhooks.address_checked("https://93.184.215.14/hook") == (
        "93.184.215.14",
        "93.184.215.14",
    )


def test_the_request_goes_to_the_address_that_was_checked(
    receiver: Receiver, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A name that resolves to the checked address first and elsewhere after (DNS
    rebinding) is only ever resolved once: the delivery is pinned to the first answer."""
    settings.WEBHOOK_ALLOW_PRIVATE = True
    port = receiver.server.server_address[1]
    answers = iter(["127.0.0.1", "10.255.255.1"])
    looked_up: list[str] = []

    def rebinding_resolver(host: str, *args: Any, **kwargs: Any) -> list[Any]:
        try:
            address = str(ipaddress.ip_address(host))  # an address resolves to itself
        except ValueError:
            looked_up.append(host)
            address = next(answers)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))]

    monkeypatch.setattr(socket, "getaddrinfo", rebinding_resolver)
    webhooks.post_signed(
        url=f"http://hooks.example.test:{port}/hook", secret="", event="item.decided", payload={}
    )
    [(headers, _body)] = receiver.requests
    assert headers["Host"] == f"hooks.example.test:{port}"  # the name kept
    assert looked_up == ["hooks.example.test"]  # resolved once, for the check


def test_the_signature_covers_a_timestamp_a_receiver_can_check(
    receiver: Receiver, settings: Any
) -> None:
    settings.WEBHOOK_ALLOW_PRIVATE = True
    webhooks.post_signed(url=receiver.url, secret="s3cret", event="item.decided", payload={"a": 1})
    [(headers, body)] = receiver.requests
    timestamp = int(headers["X-Icrlhf-Timestamp"])
    expected = hmac.new(b"s3cret", f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    assert headers["X-Icrlhf-Signature"] == f"sha256={expected}"
    # The body alone (the old scheme) no longer verifies: a replay cannot drop the time.
    assert hmac.new(b"s3cret", body, hashlib.sha256).hexdigest() != expected


@pytest.mark.django_db
def test_the_webhook_secret_is_write_only_in_the_admin() -> None:
    queue = QueueFactory(webhook_url="https://hooks.example.org/x", webhook_secret="old-secret")
    admin = Client()
    admin.force_login(UserFactory(is_staff=True, is_superuser=True))
    url = f"/admin/queues/queue/{queue.pk}/change/"
    page = admin.get(url).content.decode()
    assert "old-secret" not in page and 'name="webhook_secret"' in page
    form = QueueAdminForm(instance=queue)
    form.cleaned_data = {"webhook_secret": ""}
    assert form.clean_webhook_secret() == "old-secret"  # left empty: kept
    form.cleaned_data = {"webhook_secret": "new-secret"}
    assert form.clean_webhook_secret() == "new-secret"
