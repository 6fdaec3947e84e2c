"""OpenAPI documentation shared by the API's views: the error body and its responses, and the
page envelopes. tests/test_openapi_schema.py checks real responses against the result."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiParameter, OpenApiResponse
from rest_framework import serializers


class ErrorSerializer(serializers.Serializer):
    """Every error: a code, a text, and per code some extras (documented in docs/decisions.md)."""

    error = serializers.CharField(help_text="Machine-readable code, e.g. invalid_request.")
    detail = serializers.CharField(help_text="Human-readable explanation.")
    # The wire name; the metaclass takes declared fields off the class, so `.fields` still works.
    fields = serializers.DictField(  # type: ignore[assignment]
        child=serializers.CharField(),
        required=False,
        help_text="Validation errors: field path (e.g. [2].content) → problem.",
    )
    limit = serializers.IntegerField(
        required=False, help_text="The bound that was passed (413, nesting_too_deep, 422)."
    )
    retryAfter = serializers.IntegerField(required=False, help_text="Seconds to wait (429).")


_ERROR_TEXTS = {
    400: "Bad input (invalid_request, malformed_json, nesting_too_deep, invalid_content, …).",
    401: "Not authenticated (not_authenticated, authentication_failed).",
    403: "Not allowed (permission_denied).",
    404: "Not found, or not yours (not_found).",
    409: "Conflict (idempotency_conflict, compaction_in_progress, not_revertible).",
    413: "Body too large (request_too_large, too_many_events).",
    415: "Body is not JSON (unsupported_media_type).",
    422: "Unprocessable (context_window_exhausted, token_usage_total_exceeded).",
    429: "Throttled (throttled, with retryAfter; Retry-After header).",
    503: "A service the request needs is down (service_unavailable, with Retry-After).",
}

# Every authenticated endpoint can answer these.
COMMON = (401, 403, 429)
# ...and every endpoint that reads a JSON body these.
BODY = (400, 413, 415)


def errors(*codes: int) -> dict[int, OpenApiResponse]:
    """Responses with the error body for `codes` plus the ones every endpoint has."""
    return {
        code: OpenApiResponse(ErrorSerializer, description=_ERROR_TEXTS[code])
        for code in sorted({*codes, *COMMON})
    }


def page_of(name: str, item: Any) -> type[serializers.Serializer]:
    """The page-number envelope SessionPagination returns around `item` serializers."""
    return type(
        name,
        (serializers.Serializer,),
        {
            "count": serializers.IntegerField(),
            "next": serializers.URLField(allow_null=True),
            "previous": serializers.URLField(allow_null=True),
            "results": item(many=True),
            "__doc__": f"One page of {item.__name__.removesuffix('Serializer')} objects.",
        },
    )


# The largest value a numeric query parameter may take (a database integer).
MAX_QUERY_INTEGER = 2**63 - 1


def integer(minimum: int, maximum: int = MAX_QUERY_INTEGER) -> dict[str, Any]:
    """A query parameter's schema with the bounds the API enforces (so the documented range
    is the accepted one: outside it, and empty or malformed, is a 400)."""
    return {"type": "integer", "minimum": minimum, "maximum": maximum}


PAGE_PARAMETERS = [
    OpenApiParameter("page", integer(1), description="Page number, from 1."),
    OpenApiParameter("pageSize", integer(1), description="Items per page (at most 500)."),
]
