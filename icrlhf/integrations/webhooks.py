"""The one place that sends outbound webhooks (signed JSON over HTTP).

A webhook URL is whatever a queue's editor typed, so it is checked before every delivery:
its host is resolved, and an address that is not on the public internet (loopback, private,
link-local, reserved, multicast) is refused unless WEBHOOK_ALLOW_PRIVATE says otherwise.
The request then goes to the address that was checked, with the name kept for the Host
header and TLS (SNI and the certificate's check): a name that resolves to a public address
for the check and to an internal one a moment later (DNS rebinding) gains nothing.

The signature covers a timestamp and the body: HMAC-SHA256 of "<timestamp>.<body>", so a
receiver can reject a replayed delivery by its age (docs/api.md, "The decision webhook")."""

import hashlib
import hmac
import ipaddress
import json
import socket
import time
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
from django.conf import settings

SIGNATURE_HEADER = "X-Icrlhf-Signature"
TIMESTAMP_HEADER = "X-Icrlhf-Timestamp"
EVENT_HEADER = "X-Icrlhf-Event"
_TIMEOUT_S = 10.0


class WebhookTransientError(RuntimeError):
    """Connection trouble, a timeout, 429 or 5xx: worth retrying."""


class WebhookRejectedError(RuntimeError):
    """The receiver answered 4xx, or its address is not allowed: retrying would not help."""


def signature(secret: str, timestamp: int, body: bytes) -> str:
    signed = f"{timestamp}.".encode() + body
    return "sha256=" + hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()


def address_checked(url: str) -> tuple[str, str]:
    """The address to connect to for `url` and the host name it stands for; refuses a URL
    whose host resolves to an address that is not public (unless allowed)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise WebhookRejectedError("A webhook URL must be http(s) with a host.")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        found = socket.getaddrinfo(parts.hostname, port, type=socket.SOCK_STREAM)
    except OSError as error:
        raise WebhookTransientError(f"{parts.hostname} could not be resolved: {error}") from error
    addresses = [ipaddress.ip_address(str(entry[4][0]).split("%")[0]) for entry in found]
    if not settings.WEBHOOK_ALLOW_PRIVATE:
        internal = [a for a in addresses if not a.is_global]
        if internal:  # every address must be public: any one of them may be the one used
            raise WebhookRejectedError(
                f"{parts.hostname} resolves to {internal[0]}, which is not a public address "
                "(WEBHOOK_ALLOW_PRIVATE allows such receivers)."
            )
    return str(addresses[0]), parts.hostname


def _pinned(url: str, address: str) -> str:
    """The URL with its host replaced by the checked address (the port and path kept)."""
    parts = urlsplit(url)
    host = f"[{address}]" if ":" in address else address
    netloc = host + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path or "/", parts.query, ""))


def post_signed(*, url: str, secret: str, event: str, payload: dict[str, Any]) -> int:
    """POST the payload as JSON to the checked address, signed over a timestamp and the
    exact body sent."""
    address, host = address_checked(url)
    body = json.dumps(payload, ensure_ascii=False, sort_keys=True).encode()
    timestamp = int(time.time())
    parts = urlsplit(url)
    headers = {
        "Content-Type": "application/json",
        "Host": parts.netloc.rsplit("@", 1)[-1],
        EVENT_HEADER: event,
        TIMESTAMP_HEADER: str(timestamp),
    }
    if secret:
        headers[SIGNATURE_HEADER] = signature(secret, timestamp, body)
    try:
        with httpx.Client(timeout=_TIMEOUT_S) as client:
            request = client.build_request(
                "POST",
                _pinned(url, address),
                content=body,
                headers=headers,
                extensions={"sni_hostname": host},  # TLS checks the name, not the address
            )
            response = client.send(request)
    except httpx.HTTPError as error:
        raise WebhookTransientError(f"{url} could not be reached: {error}") from error
    if response.status_code == 429 or response.status_code >= 500:
        raise WebhookTransientError(f"{url} answered {response.status_code}")
    if response.status_code >= 400:
        raise WebhookRejectedError(f"{url} refused the webhook with {response.status_code}")
    return response.status_code
