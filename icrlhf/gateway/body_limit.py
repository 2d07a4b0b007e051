"""The gateway's request-size limit, enforced as the body arrives.

Django's ASGI handler reads a whole body before any view runs: counting it on the way in
refuses a body past GATEWAY_MAX_REQUEST_BYTES (a chunked one included) instead of storing it."""

from collections.abc import Awaitable, Callable
from typing import Any

from django.conf import settings

ASGIApp = Callable[[dict[str, Any], Any, Any], Awaitable[None]]
_TOO_LARGE = (
    b'{"error": {"message": "The request is larger than GATEWAY_MAX_REQUEST_BYTES.", '
    b'"type": "invalid_request_error", "param": null, "code": "request_too_large"}}'
)


class _TooLarge(Exception):
    pass


def body_limited(app: ASGIApp) -> ASGIApp:
    async def limited(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await app(scope, receive, send)
        received = 0

        async def counted_receive() -> Any:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > settings.GATEWAY_MAX_REQUEST_BYTES:
                raise _TooLarge
            return message

        try:
            await app(scope, counted_receive, send)
        except _TooLarge:
            headers = [(b"content-type", b"application/json")]
            await send({"type": "http.response.start", "status": 413, "headers": headers})
            await send({"type": "http.response.body", "body": _TOO_LARGE})

    return limited
