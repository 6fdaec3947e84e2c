"""Bounds on a streamed reply: its size and its duration.

An upstream that never stops streaming (or a reply far larger than any conversation turn)
must not grow the server's memory without end: the relay holds one chunk at a time, but
the reply is also accumulated to be recorded. So a streamed reply is cut, with the
provider's own error event, once it exceeds `LEDGER_GATEWAY_STREAM_MAX_BYTES` or has lasted
`LEDGER_GATEWAY_STREAM_MAX_SECONDS`; what arrived until then is recorded and marked
incomplete (stream.py), so the ledger holds at most the bound per reply.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from django.conf import settings

from compaction_app.gateway.forward import UpstreamError, UpstreamResponse


class BoundedResponse:
    """An upstream response whose raw stream ends with UpstreamError past the bounds."""

    def __init__(self, response: UpstreamResponse, *, max_bytes: int, max_seconds: float) -> None:
        self._response = response
        self.max_bytes = max_bytes
        self.max_seconds = max_seconds

    def __getattr__(self, name: str) -> Any:
        return getattr(self._response, name)

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        """The upstream's bytes, unchanged, in whole server-sent events: a cut then falls
        between two events, so the error event that follows it parses (a partial event is
        held only until its end arrives, at most one event's worth of memory)."""
        started = time.monotonic()
        total = 0
        pending = b""
        chunks = self._response.aiter_raw().__aiter__()
        while True:
            left = self.max_seconds - (time.monotonic() - started)
            try:
                if left <= 0:
                    raise TimeoutError
                chunk = await asyncio.wait_for(chunks.__anext__(), timeout=left)
            except StopAsyncIteration:
                if pending:
                    yield pending
                return
            except TimeoutError:
                raise UpstreamError(
                    f"the reply was cut after {self.max_seconds:g} s, the gateway's limit "
                    "for one streamed reply"
                ) from None
            total += len(chunk)
            if total > self.max_bytes:
                raise UpstreamError(
                    f"the reply was cut at {self.max_bytes} bytes, the gateway's limit for one "
                    "streamed reply"
                )
            data = pending + chunk
            end = _events_end(data)
            pending = data[end:]
            if end:
                yield data[:end]

    async def aclose(self) -> None:
        await self._response.aclose()


def _events_end(data: bytes) -> int:
    """The length of `data`'s whole events (up to its last blank line), 0 when none ends."""
    ends = [data.rfind(sep) + len(sep) for sep in (b"\n\n", b"\r\n\r\n") if sep in data]
    return max(ends, default=0)


def bounded(response: UpstreamResponse) -> UpstreamResponse:
    """`response` with the configured bounds on its streamed body."""
    return BoundedResponse(  # type: ignore[return-value]
        response,
        max_bytes=int(settings.LEDGER_GATEWAY_STREAM_MAX_BYTES),
        max_seconds=float(settings.LEDGER_GATEWAY_STREAM_MAX_SECONDS),
    )
