"""Domain errors raised by services and selectors; the API maps them to the error format."""

from __future__ import annotations

from typing import Any


class LedgerError(Exception):
    status = 400
    code = "invalid_request"

    def __init__(self, detail: str, *, code: str | None = None, **extra: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        if code:
            self.code = code
        self.extra = extra


class InvalidInput(LedgerError):
    status = 400
    code = "invalid_request"


class Conflict(LedgerError):
    status = 409
    code = "conflict"


class NotFound(LedgerError):
    status = 404
    code = "not_found"


class Unprocessable(LedgerError):
    status = 422
    code = "unprocessable"


class ServiceUnavailable(LedgerError):
    """A backing service (the task broker) is unreachable; the client should retry later.
    `retryAfter` (seconds) is sent in the body and as the Retry-After header."""

    status = 503
    code = "service_unavailable"


class TooManyRequests(LedgerError):
    """The caller already has as many heavy requests running as it may; `retryAfter` (seconds)
    is sent in the body and as the Retry-After header."""

    status = 429
    code = "too_many_requests"
