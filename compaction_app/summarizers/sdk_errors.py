"""Maps an official SDK's exception to a SummarizerError.

The openai and anthropic SDKs share one generated exception hierarchy (APITimeoutError ⊂
APIConnectionError, APIStatusError, APIResponseValidationError), so one mapping serves both.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from .base import SummarizerError
from .prompts import is_transient_status, short_detail


def sdk_error(exc: Exception, *, sdk: ModuleType, provider: str, secret: str) -> SummarizerError:
    """Timeouts, connection failures, 429 and 5xx are transient; everything else is
    permanent. The key never appears in the message."""
    if isinstance(exc, sdk.APITimeoutError):
        return SummarizerError(f"{provider}: request timed out", permanent=False)
    if isinstance(exc, sdk.APIConnectionError):
        detail = short_detail(str(exc), secret=secret)
        return SummarizerError(f"{provider}: connection failed: {detail}", permanent=False)
    if isinstance(exc, sdk.APIStatusError):
        return _status_error(exc, provider=provider, secret=secret)
    if isinstance(exc, sdk.APIResponseValidationError | ValueError | TypeError):
        # ValueError covers a body that is not JSON (json.JSONDecodeError).
        detail = short_detail(str(exc), secret=secret)
        return SummarizerError(f"{provider}: malformed response: {detail}", permanent=True)
    return SummarizerError(f"{provider}: {short_detail(str(exc), secret=secret)}", permanent=True)


def _status_error(exc: Any, *, provider: str, secret: str) -> SummarizerError:
    status = exc.status_code
    detail = short_detail(_error_message(exc), secret=secret)
    retry_after = exc.response.headers.get("retry-after")
    if status == 429 and retry_after:
        detail += f" (retry after {retry_after}s)"
    return SummarizerError(
        f"{provider}: HTTP {status}: {detail}", permanent=not is_transient_status(status)
    )


def _error_message(exc: Any) -> str:
    body = exc.body
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return error["message"]
    return str(exc.message)
