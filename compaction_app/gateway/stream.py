"""Relaying a streamed reply: chunks go to the client as they arrive, the reply is recorded
when the stream ends (or marked incomplete when the client leaves or the upstream breaks)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from compaction_app.gateway.forward import UpstreamError, UpstreamResponse
from compaction_app.gateway.wire import StreamAccumulator

logger = logging.getLogger("compaction_app.gateway")

# How a relayed stream ended (StreamEnding.reason).
COMPLETE = "complete"
PROVIDER_ERROR = "provider_error"  # the provider's own error event
INTERRUPTED = "interrupted"  # the upstream broke off or closed early
MALFORMED = "malformed"  # the upstream sent an event the wire's reader could not read
CLIENT_DISCONNECTED = "client_disconnected"


@dataclass
class StreamEnding:
    first_chunk: float | None = None  # time.monotonic() of the upstream's first chunk
    reason: str = ""
    # Why the stream was ended by the gateway (MALFORMED: which event, what failed).
    detail: str = ""


# Recording tasks started while a cancelled stream unwinds: referenced until done so the
# event loop does not drop them.
_pending: set[asyncio.Task[Any]] = set()


async def relay(
    *,
    response: UpstreamResponse,
    accumulator: StreamAccumulator,
    stream_error: Callable[[str], bytes],
    on_end: Callable[[bool], Awaitable[None]],
    ending: StreamEnding | None = None,
) -> AsyncIterator[bytes]:
    """Yield the upstream's bytes unchanged; on the way, feed them to `accumulator`. At the
    end call `on_end(incomplete)`. An upstream failure mid-stream reaches the client as the
    provider's own error event. `ending`, when given, learns when the first chunk came and
    how the stream ended (the call's record)."""
    finished = False
    try:
        async for chunk in response.aiter_raw():
            if ending is not None and ending.first_chunk is None:
                ending.first_chunk = time.monotonic()
            try:
                accumulator.feed(chunk)
            except Exception as exc:  # a reader without SSEAccumulator's own guard
                accumulator.malformed = f"{type(exc).__name__} reading the stream"
                accumulator.cut = 0
            if accumulator.malformed:
                # What came before the event it could not read is forwarded, then the stream
                # ends with the provider's own error event: the client gets an end, the call
                # its row, the reply what was read (issue 42, row 1).
                logger.warning("gateway: unreadable event in a stream: %s", accumulator.malformed)
                if accumulator.cut:
                    yield chunk[: accumulator.cut]
                if ending is not None:
                    ending.reason, ending.detail = MALFORMED, accumulator.malformed
                finished = True
                yield stream_error(
                    "the provider sent an event the gateway could not read "
                    f"({accumulator.malformed}); the stream was ended there"
                )
                return
            yield chunk
        finished = True
        if not accumulator.done and not accumulator.errored:
            # The upstream closed the connection before its last event.
            if ending is not None:
                ending.reason = INTERRUPTED
            yield stream_error("the upstream stream ended before the reply was complete")
    except UpstreamError as exc:
        logger.warning("upstream stream broke: %s", exc)
        if ending is not None:
            ending.reason = INTERRUPTED
        yield stream_error(f"the upstream stream was interrupted ({exc})")
    finally:
        if ending is not None and not ending.reason:
            if accumulator.errored:
                ending.reason = PROVIDER_ERROR
            elif accumulator.done:
                ending.reason = COMPLETE
            else:
                # Neither the upstream's end nor its failure: the client stopped reading.
                ending.reason = CLIENT_DISCONNECTED
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
