"""The one place code outside consumers pushes to websockets."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import uuid
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from redis.exceptions import RedisError

from compaction_app.realtime.messages import Message

logger = logging.getLogger("compaction_app.broadcast")

STAFF_GROUP = "ledger.staff"

# Set by async callers (the gateway) to their event loop before they hop into a sync thread:
# pushes are then handed to that loop without the thread waiting for them, in order.
DEFER_TO_LOOP: contextvars.ContextVar[asyncio.AbstractEventLoop | None] = contextvars.ContextVar(
    "ledger_broadcast_loop", default=None
)
_last_deferred: dict[asyncio.AbstractEventLoop, Any] = {}


def session_group(session_id: uuid.UUID | str) -> str:
    return f"ledger.session.{session_id}"


def user_group(user_id: int | str) -> str:
    return f"ledger.user.{user_id}"


def broadcast(*, session_id: uuid.UUID | str, owner_id: int | str, message: Message) -> None:
    """Send `message` (a typed realtime message, messages.py) to everyone watching the
    session: its own channel, its owner's all-sessions channel, and staff. A layer failure is
    logged, never raised: a push is a notification, and the state it announces is already
    committed."""
    layer = get_channel_layer()
    if layer is None:
        return
    event = {"type": "ledger.message", "message": message.to_json()}
    groups = (session_group(session_id), user_group(owner_id), STAFF_GROUP)

    async def send_all() -> None:
        many = getattr(layer, "group_send_many", None)
        if many is not None:
            await many(groups, event)
            return
        for group in groups:
            await layer.group_send(group, event)

    loop = DEFER_TO_LOOP.get()
    if loop is not None and loop.is_running():
        _defer(loop, send_all, session_id)
        return
    try:
        # One hop into async for all three groups: each async_to_sync costs a thread switch.
        async_to_sync(send_all)()
    except (RedisError, OSError) as exc:
        # A Redis outage: one line per skipped push, not a traceback (the connect timeout in
        # settings bounds how long this takes).
        logger.warning("websocket broadcast for session %s skipped: %s", session_id, exc)
    except Exception:
        logger.exception("websocket broadcast failed for session %s", session_id)


def _defer(loop: asyncio.AbstractEventLoop, send: Any, session_id: uuid.UUID | str) -> None:
    """Run `send` on `loop` after the pushes deferred before it (so they arrive in order),
    without waiting; failures are logged like the synchronous path's."""
    previous = _last_deferred.get(loop)

    async def chained() -> None:
        if previous is not None:
            await asyncio.wrap_future(previous)
        try:
            await send()
        except Exception:
            logger.exception("websocket broadcast failed for session %s", session_id)

    future = asyncio.run_coroutine_threadsafe(chained(), loop)
    _last_deferred[loop] = future

    def forget(done: Any) -> None:
        if _last_deferred.get(loop) is done:
            _last_deferred.pop(loop, None)

    future.add_done_callback(forget)
