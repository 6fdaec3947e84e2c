"""Relaying a streamed reply: chunks go to the client as they arrive, the reply is recorded
when the stream ends (or marked incomplete when the client leaves or the upstream breaks)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from compaction_app.gateway.forward import UpstreamError, UpstreamResponse
from compaction_app.gateway.wire import StreamAccumulator

logger = logging.getLogger("compaction_app.gateway")

# Recording tasks started while a cancelled stream unwinds: referenced until done so the
# event loop does not drop them.
_pending: set[asyncio.Task[Any]] = set()


async def relay(
    *,
    response: UpstreamResponse,
    accumulator: StreamAccumulator,
    stream_error: Callable[[str], bytes],
    on_end: Callable[[bool], Awaitable[None]],
) -> AsyncIterator[bytes]:
    """Yield the upstream's bytes unchanged; on the way, feed them to `accumulator`. At the
    end call `on_end(incomplete)`. An upstream failure mid-stream reaches the client as the
    provider's own error event."""
    finished = False
    try:
        async for chunk in response.aiter_raw():
            accumulator.feed(chunk)
            yield chunk
        finished = True
        if not accumulator.done and not accumulator.errored:
            # The upstream closed the connection before its last event.
            yield stream_error("the upstream stream ended before the reply was complete")
    except UpstreamError as exc:
        logger.warning("upstream stream broke: %s", exc)
        yield stream_error(f"the upstream stream was interrupted ({exc})")
    finally:
        # Complete once the provider's closing event went through, even if the client hung up
        # right after reading it.
        incomplete = not accumulator.done or accumulator.errored
        task = asyncio.ensure_future(_finish(response, on_end, incomplete))
        _pending.add(task)
        task.add_done_callback(_pending.discard)
        if finished:
            # Shielded: a client hanging up now must not cancel the recording with it.
            await asyncio.shield(task)


async def _finish(
    response: UpstreamResponse, on_end: Callable[[bool], Awaitable[None]], incomplete: bool
) -> None:
    try:
        await response.aclose()
        await on_end(incomplete)
    except Exception:
        logger.exception("recording a streamed reply failed")
