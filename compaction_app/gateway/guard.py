"""What the gateway checks before a view parses a request's body: the headers, then the caller.

Run by the gateway's ASGI handler (asgi.py, right after the HTTPS redirect) on the raw ASGI
scope, so a request that would be refused anyway costs no JSON parse and records nothing:
- every header: no control characters (HTAB aside). They would reach the upstream client,
  which refuses them mid-call, after the user's message was stored.
- `X-Ledger-*` headers: no control characters at all, and valid UTF-8. The server decodes
  header bytes as Latin-1; `ledger_headers_as_utf8` re-decodes them so a key such as
  `sess-été` is stored exactly as the client sent it.
- `X-Ledger-Key`: present on a POST, else 401; and valid before the view's refusal of a body
  is shown (`unless_unauthenticated`), else 401.
The answers are in the provider's error shape (the wire module is chosen by the path).
"""

from __future__ import annotations

import re
from typing import Any

from django.http import HttpRequest, JsonResponse
from django.http.response import HttpResponseBase

from compaction_app.gateway import providers, workers
from compaction_app.gateway.messages import GatewayError
from compaction_app.gateway.record import authenticate
from compaction_app.gateway.wire import Wire

_ANY_CONTROL = re.compile(rb"[\x00-\x1f\x7f]")
_CONTROL_BUT_TAB = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
_LEDGER_PREFIX = b"x-ledger-"
_META_PREFIX = "HTTP_X_LEDGER_"


def wire_for(path: str) -> Wire:
    """The wire whose error shape a path under /gateway/ answers in (the registry's)."""
    return providers.for_path(path)


def error_response(wire: Wire, exc: GatewayError) -> JsonResponse:
    body = wire.error_body(
        exc.message, status=exc.status, code=exc.code, param=exc.param, **exc.extra
    )
    return JsonResponse(body, status=exc.status)


def check_headers(headers: list[tuple[bytes, bytes]]) -> GatewayError | None:
    """The first header the gateway refuses, as a 400; None when all are acceptable."""
    for raw_name, value in headers:
        name = raw_name.decode("latin-1")
        if raw_name.lower().startswith(_LEDGER_PREFIX):
            if _ANY_CONTROL.search(value):
                return GatewayError(
                    f"the {name} header contains a control character",
                    code="invalid_header",
                    param=name,
                )
            try:
                value.decode("utf-8")
            except UnicodeDecodeError:
                return GatewayError(
                    f"the {name} header is not valid UTF-8", code="invalid_header", param=name
                )
        elif _CONTROL_BUT_TAB.search(value):
            # Said without the value: it may be a credential (Authorization, x-api-key).
            return GatewayError(
                f"the {name} header contains a control character",
                code="invalid_header",
                param=name,
            )
    return None


def _header(headers: list[tuple[bytes, bytes]], wanted: bytes) -> str | None:
    for name, value in headers:
        if name.lower() == wanted:
            return value.decode("utf-8")
    return None


async def refuse_early(scope: Any) -> JsonResponse | None:
    """The response for a request refused on its headers or a missing key; None to go on."""
    headers = list(scope.get("headers") or [])
    refused = check_headers(headers)
    if refused is None and scope.get("method") == "POST" and not _header(headers, b"x-ledger-key"):
        refused = GatewayError(
            "X-Ledger-Key header is required", status=401, code="invalid_api_key"
        )
    if refused is None:
        return None
    return error_response(wire_for(scope.get("path", "")), refused)


async def unless_unauthenticated(scope: Any, response: HttpResponseBase) -> HttpResponseBase:
    """`response`, or a 401 when it is a refusal and the caller's key is not valid.

    A present key is checked by the view in the same look-up as its session (one statement on
    the hot path, record.py), which comes after the body is parsed. So a refusal the view made
    before that look-up (a malformed body, a bad header) is only shown to a valid key's
    holder: checked here, on the error path alone, so a successful call costs nothing more."""
    if response.status_code < 400 or response.status_code in (401, 404, 405):
        # An unknown path or method says nothing of the request's body: answered as is.
        return response
    try:
        await workers.run(authenticate, _header(list(scope.get("headers") or []), b"x-ledger-key"))
    except GatewayError as exc:
        return error_response(wire_for(scope.get("path", "")), exc)
    return response


def ledger_headers_as_utf8(request: HttpRequest) -> None:
    """Re-decode the `X-Ledger-*` headers Django read as Latin-1 (check_headers vouched for
    their UTF-8)."""
    for key, value in list(request.META.items()):
        if key.startswith(_META_PREFIX) and isinstance(value, str):
            try:
                request.META[key] = value.encode("latin-1").decode("utf-8")
            except (UnicodeEncodeError, UnicodeDecodeError):
                continue
