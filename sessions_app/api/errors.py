"""The API's error format: {"error": code, "detail": text, ...extra}."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.http import Http404, HttpRequest, JsonResponse
from django.http.response import HttpResponseBase
from django.views import defaults
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from sessions_app.errors import LedgerError


def _flatten(detail: Any, prefix: str = "") -> dict[str, str]:
    fields: dict[str, str] = {}
    if isinstance(detail, dict):
        for key, value in detail.items():
            # A list serializer reports per-item errors keyed by index: show them as "[2].content".
            if isinstance(key, int):
                name = f"{prefix}[{key}]"
            else:
                name = f"{prefix}.{key}" if prefix else str(key)
            if key == "non_field_errors":
                name = prefix or "body"
            fields.update(_flatten(value, name))
    elif isinstance(detail, list):
        if all(isinstance(item, str) for item in detail):
            if detail:
                fields[prefix or "body"] = " ".join(str(item) for item in detail)
        else:
            for index, value in enumerate(detail):
                if value:
                    fields.update(_flatten(value, f"{prefix}[{index}]"))
    else:
        fields[prefix or "body"] = str(detail)
    return fields


_CODES = {
    exceptions.ParseError: "malformed_json",
    exceptions.NotAuthenticated: "not_authenticated",
    exceptions.AuthenticationFailed: "authentication_failed",
    exceptions.PermissionDenied: "permission_denied",
    exceptions.NotFound: "not_found",
    exceptions.MethodNotAllowed: "method_not_allowed",
    exceptions.NotAcceptable: "not_acceptable",
    exceptions.UnsupportedMediaType: "unsupported_media_type",
    exceptions.Throttled: "throttled",
}


def _printable(value: Any) -> Any:
    """Error payloads echo client input (field names, choices); a lone surrogate in it would
    make the JSON renderer's UTF-8 encode fail with a 500, so it is shown escaped instead."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return value.encode("utf-8", "backslashreplace").decode("utf-8")
        return value
    if isinstance(value, dict):
        return {_printable(key): _printable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_printable(item) for item in value]
    return value


def error_response(code: str, detail: str, status_code: int, **extra: Any) -> Response:
    return Response(_printable({"error": code, "detail": detail, **extra}), status=status_code)


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, LedgerError):
        ledger_response = error_response(exc.code, exc.detail, exc.status, **exc.extra)
        if "retryAfter" in exc.extra:
            ledger_response["Retry-After"] = str(exc.extra["retryAfter"])
        return ledger_response
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied()
    if isinstance(exc, exceptions.ValidationError):
        fields = _flatten(exc.detail)
        first = next(iter(fields.items()), ("body", "invalid"))
        return error_response(
            "invalid_request", f"{first[0]}: {first[1]}", status.HTTP_400_BAD_REQUEST, fields=fields
        )
    response = drf_exception_handler(exc, context)
    if response is None or not isinstance(exc, exceptions.APIException):
        return response
    code = next((code for cls, code in _CODES.items() if isinstance(exc, cls)), exc.default_code)
    extra: dict[str, Any] = {}
    wait = getattr(exc, "wait", None) if isinstance(exc, exceptions.Throttled) else None
    if wait is not None:
        extra["retryAfter"] = int(wait + 0.999)
    detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
    if isinstance(exc, exceptions.NotAuthenticated) and _sent_another_scheme(context):
        # "Bearer <key>" is what most APIs take; DRF ignores a scheme it does not know and
        # says nothing was sent, which sends people looking in the wrong place.
        detail = (
            "The API token goes in `Authorization: Token <key>`; "
            "this request used another scheme (e.g. Bearer)."
        )
    response.data = _printable({"error": code, "detail": detail, **extra})
    return response


def _sent_another_scheme(context: dict[str, Any]) -> bool:
    request = context.get("request")
    header = request.META.get("HTTP_AUTHORIZATION", "") if request is not None else ""
    scheme = header.split(" ", 1)[0].lower() if isinstance(header, str) else ""
    return bool(scheme) and scheme != "token"


def server_error(request: HttpRequest) -> HttpResponseBase:
    """handler500: API clients get the error format even for a bug; pages keep Django's."""
    if request.path.startswith("/api/"):
        return JsonResponse(
            {
                "error": "internal_error",
                "detail": "An unexpected error occurred; it has been logged.",
            },
            status=500,
        )
    return defaults.server_error(request)


def not_found(request: HttpRequest, exception: Exception) -> HttpResponseBase:
    """handler404: an unknown API path answers in the error format too."""
    if request.path.startswith("/api/"):
        return JsonResponse({"error": "not_found", "detail": "No such endpoint."}, status=404)
    return defaults.page_not_found(request, exception)
