"""The one place that sends outbound webhooks (signed JSON over HTTP)."""

import hashlib
import hmac
import json
from typing import Any

import httpx

SIGNATURE_HEADER = "X-Icrlhf-Signature"
EVENT_HEADER = "X-Icrlhf-Event"
_TIMEOUT_S = 10.0


class WebhookTransientError(RuntimeError):
    """Connection trouble, a timeout, 429 or 5xx: worth retrying."""


class WebhookRejectedError(RuntimeError):
    """The receiver answered 4xx: retrying would not help."""


def signature(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def post_signed(*, url: str, secret: str, event: str, payload: dict[str, Any]) -> int:
    """POST the payload as JSON, signed with HMAC-SHA256 of the exact body sent."""
    body = json.dumps(payload, ensure_ascii=False, sort_keys=True).encode()
    headers = {"Content-Type": "application/json", EVENT_HEADER: event}
    if secret:
        headers[SIGNATURE_HEADER] = signature(secret, body)
    try:
        response = httpx.post(url, content=body, headers=headers, timeout=_TIMEOUT_S)
    except httpx.HTTPError as error:
        raise WebhookTransientError(f"{url} could not be reached: {error}") from error
    if response.status_code == 429 or response.status_code >= 500:
        raise WebhookTransientError(f"{url} answered {response.status_code}")
    if response.status_code >= 400:
        raise WebhookRejectedError(f"{url} refused the webhook with {response.status_code}")
    return response.status_code
