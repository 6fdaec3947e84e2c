"""The gateway's own ASGI handler: Django, without the site's sync middleware.

The gateway sits in the agent's call path, so every millisecond it adds is paid on every
provider call. Under ASGI each of the site's sync middleware (sessions, CSRF, auth, messages,
clickjacking, htmx, common) costs two thread hops per request even though none of them
applies to the gateway: its views are async, CSRF-exempt, authenticate by `X-Ledger-Key`
and answer JSON or SSE. Requests under `/gateway/` therefore go to a Django ASGI handler
whose only middleware is SecurityMiddleware's logic run inline (it does no I/O): the same
HTTPS redirect and security headers as the rest of the site, without a thread hop.
Everything else is Django's own handler: URL resolution, request_started/request_finished
(which close stale database connections), exception handling.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import markcoroutinefunction
from django.core.handlers.asgi import ASGIHandler
from django.core.handlers.exception import convert_exception_to_response
from django.http import HttpRequest
from django.http.response import HttpResponseBase
from django.middleware.security import SecurityMiddleware

PREFIX = "/gateway/"

AsyncGetResponse = Callable[[HttpRequest], Awaitable[HttpResponseBase]]


class InlineSecurityMiddleware:
    """SecurityMiddleware's request and response steps, called inline on the event loop."""

    async_capable = True
    sync_capable = False

    def __init__(self, get_response: AsyncGetResponse) -> None:
        self.get_response = get_response
        self.security = SecurityMiddleware(get_response)
        markcoroutinefunction(self)

    async def __call__(self, request: HttpRequest) -> HttpResponseBase:
        redirect = self.security.process_request(request)
        if redirect is not None:
            return redirect
        response = await self.get_response(request)
        return self.security.process_response(request, response)  # type: ignore[arg-type]


class GatewayHandler(ASGIHandler):
    """Django's ASGI handler with the gateway's middleware chain (see the module docstring)."""

    def load_middleware(self, is_async: bool = False) -> None:
        self._view_middleware: list[Any] = []
        self._template_response_middleware: list[Any] = []
        self._exception_middleware: list[Any] = []
        get_response = self._get_response_async  # type: ignore[attr-defined]
        handler = convert_exception_to_response(get_response)
        self._middleware_chain = convert_exception_to_response(
            InlineSecurityMiddleware(handler)  # type: ignore[arg-type]
        )


def with_gateway(site: Any, gateway: Any) -> Callable[[Any, Any, Any], Awaitable[None]]:
    """An ASGI app that sends HTTP requests under /gateway/ to `gateway`, the rest to `site`."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            path = scope.get("path", "")
            root = scope.get("root_path", "")
            if root and path.startswith(root):
                path = path[len(root) :]
            if path.startswith(PREFIX):
                await gateway(scope, receive, send)
                return
        await site(scope, receive, send)

    return app
