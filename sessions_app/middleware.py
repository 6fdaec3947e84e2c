from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse


class BodySizeLimitMiddleware:
    """Refuse oversize API bodies with 413 before anything reads them."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.path.startswith("/api/"):
            limit = settings.API_MAX_BODY_BYTES
            try:
                length = int(request.META.get("CONTENT_LENGTH") or 0)
            except ValueError:
                return JsonResponse(
                    {
                        "error": "invalid_content_length",
                        "detail": "Content-Length is not a number.",
                    },
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
        return self.get_response(request)
