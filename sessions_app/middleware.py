from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse


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
            return JsonResponse(
                {
                    "error": "request_too_large",
                    "detail": f"Request body is {length} bytes; the limit is {limit}.",
                    "limit": limit,
                },
                status=413,
            )
        return None
