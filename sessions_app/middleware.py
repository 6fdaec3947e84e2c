from __future__ import annotations

import json
from collections import deque
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Any, Any, Any], Awaitable[None]]


def _too_large_body(length: int | None, limit: int) -> dict[str, Any]:
    shown = f"{length} bytes" if length is not None else f"more than {limit} bytes"
    return {
        "error": "request_too_large",
        "detail": f"Request body is {shown}; the limit is {limit}.",
        "limit": limit,
    }


class BodySizeLimitMiddleware:
    """Refuse oversize API bodies with 413 before anything reads them.

    Sync and async capable: under ASGI a sync-only middleware would put every request (the
    gateway's async views included) through two extra thread hops."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> HttpResponse | Awaitable[HttpResponse]:
        if self.is_async:
            return self._acall(request)
        return self._check(request) or self.get_response(request)

    async def _acall(self, request: HttpRequest) -> HttpResponse:
        return self._check(request) or await self.get_response(request)

    @staticmethod
    def _check(request: HttpRequest) -> HttpResponse | None:
        if not request.path.startswith("/api/"):
            return None
        limit = settings.API_MAX_BODY_BYTES
        try:
            length = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            return JsonResponse(
                {"error": "invalid_content_length", "detail": "Content-Length is not a number."},
                status=400,
            )
        if length > limit:
            return JsonResponse(_too_large_body(length, limit), status=413)
        return None


class StreamingBodyLimit:
    """ASGI wrapper that holds API request bodies to API_MAX_BODY_BYTES as they arrive.

    Django's ASGI handler spools the whole body before any middleware runs, so a declared
    oversize body is refused here before it is read. A chunked body (no Content-Length) is read
    up to the limit and handed on with the Content-Length it turned out to have: DRF takes a
    request without one as having no body at all, which would silently read it as empty.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope.get("path", "").startswith("/api/"):
            await self.app(scope, receive, send)
            return
        limit = settings.API_MAX_BODY_BYTES
        headers = list(scope.get("headers") or [])
        declared = [value for name, value in headers if name.lower() == b"content-length"]
        if declared:
            try:
                length = int(declared[0])
            except ValueError:
                # The Django middleware answers a malformed length in the error format.
                length = 0
            if length > limit:
                await _send_json(send, 413, _too_large_body(length, limit))
                return
            await self.app(scope, receive, send)
            return

        chunks: deque[bytes] = deque()
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                await _send_json(send, 413, _too_large_body(None, limit))
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        headers = [(name, value) for name, value in headers if name.lower() != b"transfer-encoding"]
        headers.append((b"content-length", str(size).encode("ascii")))

        async def replay() -> Message:
            # Handed on as they arrived and let go of: joined, the body would be held here
            # for the whole request on top of Django's copy of it.
            if chunks:
                chunk = chunks.popleft()
                return {"type": "http.request", "body": chunk, "more_body": bool(chunks)}
            return await receive()

        await self.app({**scope, "headers": headers}, replay, send)


async def _send_json(send: Send, status: int, payload: dict[str, Any]) -> None:
    body = json.dumps(payload).encode("utf-8")
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode("ascii")),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
