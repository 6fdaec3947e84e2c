"""The one place code outside consumers pushes to websockets."""

from __future__ import annotations

import logging
import uuid
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from redis.exceptions import RedisError

logger = logging.getLogger("compaction_app.broadcast")

STAFF_GROUP = "ledger.staff"


def session_group(session_id: uuid.UUID | str) -> str:
    return f"ledger.session.{session_id}"


def user_group(user_id: int | str) -> str:
    return f"ledger.user.{user_id}"


def broadcast(*, session_id: uuid.UUID | str, owner_id: int | str, message: dict[str, Any]) -> None:
    """Send `message` to everyone watching the session: its own channel, its owner's
    all-sessions channel, and staff. A layer failure is logged, never raised: a push is a
    notification, and the state it announces is already committed."""
    layer = get_channel_layer()
    if layer is None:
        return
    event = {"type": "ledger.message", "message": message}
    groups = (session_group(session_id), user_group(owner_id), STAFF_GROUP)

    async def send_all() -> None:
        for group in groups:
            await layer.group_send(group, event)

    try:
        # One hop into async for all three groups: each async_to_sync costs a thread switch.
        async_to_sync(send_all)()
    except (RedisError, OSError) as exc:
        # A Redis outage: one line per skipped push, not a traceback (the connect timeout in
        # settings bounds how long this takes).
        logger.warning("websocket broadcast for session %s skipped: %s", session_id, exc)
    except Exception:
        logger.exception("websocket broadcast failed for session %s", session_id)
