"""The gateway's own ASGI handler: Django, without the site's sync middleware or thread hops.

The gateway sits in the agent's call path, so every millisecond it adds is paid on every
provider call. Under ASGI each of the site's sync middleware (sessions, CSRF, auth, messages,
clickjacking, htmx, common) costs two thread hops per request even though none of them
applies to the gateway: its views are async, CSRF-exempt, authenticate by `X-Ledger-Key`
and answer JSON or SSE. Requests under `/gateway/` therefore go to a Django ASGI handler
whose only middleware is SecurityMiddleware's logic run inline (it does no I/O): the same
HTTPS redirect and security headers as the rest of the site, without a thread hop.

Django's handler also starts a thread per request (a ThreadSensitiveContext) and hops into it
for request_started and again for request_finished, only to run their receivers (which close
that thread's database connections). The gateway's views never touch the ORM on the request
thread: their sync work runs on the gateway's own threads, which hand their connections back
after each hop (workers.py). So this handler sends both signals inline, on the event loop,
where their receivers find nothing to close. Everything else is Django's own handler: body
reading, URL resolution, exception handling, disconnect handling.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import tempfile
from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import markcoroutinefunction
from django.core import signals
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.core.handlers.exception import convert_exception_to_response
from django.http import HttpRequest
from django.http.response import HttpResponseBase
from django.middleware.security import SecurityMiddleware
from django.urls import set_script_prefix

from compaction_app.gateway import after, body, guard

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
        # Headers and a missing key refused before any view parses the body; a bad key
        # refused before any refusal of the body is shown (guard.py).
        refused = await guard.refuse_early(request.scope)  # type: ignore[attr-defined]
        if refused is not None:
            return self.security.process_response(request, refused)
        guard.ledger_headers_as_utf8(request)
        response = await guard.unless_unauthenticated(
            request.scope,  # type: ignore[attr-defined]
            await self.get_response(request),
        )
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

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            raise ValueError(f"the gateway serves HTTP only, not {scope['type']}")
        # No ThreadSensitiveContext: nothing here runs on a request thread (module docstring).
        await self.handle(scope, receive, send)

    async def read_body(self, receive: Any) -> Any:
        """ASGIHandler.read_body (Django 5.2) with the spool in memory up to
        body.FAST_MAX_BYTES, where the site's FILE_UPLOAD_MAX_MEMORY_SIZE (256 kB) sent a
        1,600-message call (0.27 MB) to a temporary file. Django closes the spool as soon as
        the view reads the body (HttpRequest.body), so it is not held for the request."""
        message = await receive()
        if message["type"] == "http.request" and not message.get("more_body", False):
            data = message.get("body", b"")
            if len(data) <= body.FAST_MAX_BYTES:
                # The whole body in one message (the server hands over up to 1 MiB so,
                # http_server.py): the request reads these very bytes, with no spool to copy
                # them into and out of (BytesIO shares them until written to).
                return io.BytesIO(data)
        # Closed by the request (or by handle() when there is none), as Django does.
        body_file = tempfile.SpooledTemporaryFile(  # noqa: SIM115
            max_size=body.FAST_MAX_BYTES, mode="w+b"
        )
        while True:
            if message["type"] == "http.disconnect":
                body_file.close()
                raise RequestAborted()
            if "body" in message:
                body_file.write(message["body"])
            if not message.get("more_body", False):
                break
            message = await receive()
        body_file.seek(0)
        return body_file

    async def handle(self, scope: Any, receive: Any, send: Any) -> None:
        """ASGIHandler.handle (Django 5.2) with the two signals sent inline."""
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        set_script_prefix(get_script_prefix(scope))
        signals.request_started.send(sender=self.__class__, scope=scope)
        request, error_response = self.create_request(scope, body_file)
        if request is None:
            assert error_response is not None
            body_file.close()
            await self.send_response(error_response, send)
            error_response.close()
            return

        async def process_request(request: HttpRequest, send: Any) -> HttpResponseBase:
            response = await self.run_get_response(request)
            # The client may go away while the response is being sent.
            with contextlib.suppress(asyncio.CancelledError):
                await self.send_response(response, send)
            return response

        # As Django: a disconnect while the view runs cancels it.
        serving = asyncio.create_task(process_request(request, send))
        tasks = [asyncio.create_task(self.listen_for_disconnect(receive)), serving]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            if task.done():
                try:
                    task.result()
                except RequestAborted:
                    pass
                except AssertionError:
                    body_file.close()
                    raise
            else:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        try:
            response = serving.result()
        except asyncio.CancelledError:
            signals.request_finished.send(sender=self.__class__)
        else:
            response.close()  # sends request_finished
            await after.wait_sent(response)
        body_file.close()


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
