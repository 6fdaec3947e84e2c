"""What a provider call's appends announce, sent once and after the response.

A call appends twice (the request's new messages, then the reply). Each append's
`events_appended` starts a usage push, an auto-compaction check and a search-indexing
message; inside the call that is work the agent waits for, twice over. The gateway collects
them instead (`sessions_app.signals.collect_appended`) and sends them merged, once per call,
from a worker thread once its response is ready: watchers see the usage a few milliseconds
later, and nothing is skipped (an error response, a failed stream and a call that raised
send theirs too).

The call itself (calls.Trace) is stored there too, just before the announcements (the usage
they push counts it): a call's row costs the call nothing.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from asgiref.sync import sync_to_async
from django.db import connections
from django.http import StreamingHttpResponse

from compaction_app.gateway import calls
from sessions_app.signals import collect_appended, send_collected

logger = logging.getLogger("compaction_app.gateway")

T = TypeVar("T")

_tasks: set[asyncio.Task[None]] = set()
_idle = threading.Condition()
_open = 0  # calls whose announcements are not sent yet


class Announcements:
    """One provider call's announcements, from its first append until they are sent."""

    def __init__(self, call: calls.Trace | None = None) -> None:
        global _open
        self.collected: list[dict[str, Any]] = []
        self.done = False
        # The task sending them, once started (wait_sent).
        self.task: asyncio.Task[None] | None = None
        # The call to store with them (a conversation call's).
        self.call = call
        # What the call parsed and built from its request (the body, its messages): let go
        # of on the announcements' thread. Freed when the view returned, a 1,600-message
        # conversation's objects took 0.2 ms of the response's path (issue 31, item 5).
        self.held: list[Any] = []
        with _idle:
            _open += 1

    def collecting(self, fn: Callable[..., T], /, **kwargs: Any) -> T:
        """Call `fn` (sync, in the request's thread) collecting what its appends announce."""
        with collect_appended(self.collected):
            return fn(**kwargs)

    def send_later(self) -> None:
        """Send what was collected from a worker thread, without waiting for it (once)."""
        if self.done:
            return
        self.done = True
        batch = list(self.collected)
        self.collected.clear()
        # Handed over in a list the thread empties: its last reference goes there.
        held, self.held = self.held, []
        if not batch and self.call is None:
            _close()
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # closed by a sync server: its thread is done with the response
            _send(batch, self.call, held)
            return
        # Not thread_sensitive: the request's own thread is about to finish the response.
        task = loop.create_task(
            sync_to_async(_send, thread_sensitive=False)(batch, self.call, held)
        )
        _tasks.add(task)
        task.add_done_callback(_tasks.discard)
        self.task = task


# Seconds after a non-streamed response is returned by which its announcements are sent even
# if the response was never closed.
SEND_AT_THE_LATEST = 2.0


def attach(response: Any, announced: Announcements) -> None:
    """Mark `response` as carrying `announced`, for the gateway's handler (wait_sent), and
    have a non-streamed one send them once the answer is out: at the response's close(),
    which the gateway's handler (asgi.py) calls right after handing the server the last
    byte. Started before, the announcements' thread (the calls row, the usage push) held the
    GIL while the loop wrote the answer: 1.3 ms of a 20-message call's 4.3
    (docs/decisions.md). A stream sends them when it ends (views._respond's on_end)."""
    response.ledger_announcements = announced
    if isinstance(response, StreamingHttpResponse):
        return
    response._resource_closers.append(announced.send_later)
    # Should the client's going away cancel the handler before it closes the response, they
    # are sent all the same (send_later sends once).
    asyncio.get_running_loop().call_later(SEND_AT_THE_LATEST, announced.send_later)


async def wait_sent(response: Any) -> None:
    """Until the announcements `response` carries are sent: the gateway's handler waits
    for them once the response is out, so that the event loop outlives their thread, which
    may push to that loop (broadcast.DEFER_TO_LOOP; a server that ends its loop when the
    application returns, as asgiref's async_to_sync does, would otherwise leave it waiting
    forever). The client is not kept waiting: it has the whole response by then."""
    announced = getattr(response, "ledger_announcements", None)
    task = getattr(announced, "task", None)
    if task is not None:
        await asyncio.wait({task})


def _send(
    batch: list[dict[str, Any]], call: calls.Trace | None = None, held: list[Any] | None = None
) -> None:
    if held:
        held.clear()
    try:
        # The call's row first: the usage push counts it (sessions_app.scope's `calls`).
        if call is not None:
            calls.save(call)
        try:
            if batch:
                send_collected(batch)
        except Exception:
            logger.exception("announcing a gateway call's appends failed")
    finally:
        # A pool thread serves no request, so nothing else would hand its connection back.
        connections.close_all()
        _close()


def _close() -> None:
    global _open
    with _idle:
        _open -= 1
        _idle.notify_all()


def wait_idle(timeout: float = 10.0) -> bool:
    """Block until every call begun so far has sent its announcements (tests use it before
    they clean up, a stream's included: it sends when its reply is recorded)."""
    with _idle:
        return _idle.wait_for(lambda: _open <= 0, timeout=timeout)
