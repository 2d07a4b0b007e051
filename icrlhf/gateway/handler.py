"""Django's ASGI handler and security middleware, without the threads they start for every call.

Under ASGI, Django runs each call in a context of its own (`ThreadSensitiveContext`) whose
first "thread-sensitive" piece of synchronous work starts a thread, which the call then waits
for twice more and which is shut down as it ends: `SecurityMiddleware`'s request and response
halves (a `MiddlewareMixin` hands both to that thread) and the response's `close`. None of
them touches the database or blocks: here the middleware's halves run in the event loop, and
`close` goes to the one thread Django keeps for such work across calls, so no call starts a
thread of its own. (The database and retrieval run in the gateway's own pool:
`in_flight.blocking`.) Keep the gateway's path free of other thread-sensitive work (a sync
middleware or signal receiver, the async ORM): it would run on that one shared thread, whose
database connection nothing checks (the gateway's `close_old_connections` is off)."""

from collections.abc import Awaitable, Callable
from typing import Any, cast

from django.core.handlers.asgi import ASGIHandler
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.middleware.security import SecurityMiddleware


class GatewayHandler(ASGIHandler):
    async def __call__(
        self, scope: dict[str, Any], receive: Callable[[], Awaitable[Any]], send: Any
    ) -> None:
        if scope["type"] != "http":
            raise ValueError(f"The gateway serves HTTP only, not {scope['type']}.")
        await self.handle(scope, receive, send)


class SecurityHeaders(SecurityMiddleware):
    """Django's security headers and checks, as they are, in the event loop."""

    async def __acall__(self, request: HttpRequest) -> HttpResponseBase:
        redirect = self.process_request(request)
        # Django hands an async middleware the next one's coroutine function.
        response = redirect or await cast(Awaitable[HttpResponse], self.get_response(request))
        return self.process_response(request, response)
