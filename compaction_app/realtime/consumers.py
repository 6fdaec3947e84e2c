"""Websocket consumers: live compaction and usage events, per user or per session."""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from compaction_app import metrics
from compaction_app.realtime import messages
from compaction_app.realtime.broadcast import STAFF_GROUP, session_group, user_group
from compaction_app.realtime.revocation import CLOSE_FORBIDDEN, RevocableConsumerMixin
from sessions_app.errors import NotFound
from sessions_app.selectors import session_get

CLOSE_UNAUTHENTICATED = 4401


def _visible(user: Any, session_id: str) -> bool:
    try:
        session_get(user=user, session_id=session_id)
    except NotFound:
        return False
    return True


_may_see = database_sync_to_async(_visible)


class _LedgerConsumer(RevocableConsumerMixin, AsyncJsonWebsocketConsumer):
    groups_joined: list[str]

    async def _refuse(self, code: int) -> None:
        # Accept first so the browser sees the close code (a refusal before accept is a bare
        # HTTP 403 to the client).
        await self.accept()
        await self.close(code=code)

    async def _signed_in_user(self) -> Any:
        """The connection's user, or None once the connection is refused as unauthenticated."""
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self._refuse(CLOSE_UNAUTHENTICATED)
            return None
        return user

    async def _join(self, groups: list[str]) -> None:
        # Plus the groups whose revocation closes this socket with 4401 (revocation.py).
        groups = [*groups, *self.revocation_groups()]
        self.groups_joined = groups
        for group in groups:
            await self.channel_layer.group_add(group, self.channel_name)
        await self.accept()
        self.start_rechecks()
        self.counted = True
        metrics.websocket_changed(+1)

    async def disconnect(self, code: int) -> None:
        if getattr(self, "counted", False):
            self.counted = False
            metrics.websocket_changed(-1)
        for group in getattr(self, "groups_joined", []):
            await self.channel_layer.group_discard(group, self.channel_name)

    async def ledger_message(self, event: dict[str, Any]) -> None:
        message = event["message"]
        if self._wants(message):
            await self.send_json(message)

    def _wants(self, message: dict[str, Any]) -> bool:
        return True

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        if isinstance(content, dict) and content.get("type") == "ping":
            await self.send_json(messages.Pong().to_json())


class SessionsConsumer(_LedgerConsumer):
    """`/ws/sessions/`: every session the user may see (staff: all)."""

    async def connect(self) -> None:
        user = await self._signed_in_user()
        if user is None:
            return
        self.user = user
        # Staff get the staff group only, so each message arrives once.
        self.watches_all = bool(user.is_staff)
        await self._join([STAFF_GROUP] if self.watches_all else [user_group(user.pk)])

    def still_permitted(self, user: Any) -> bool:
        # A demoted user's feed of every session closes (4403); a new socket gets its own.
        return user.is_staff or not self.watches_all


class SessionConsumer(_LedgerConsumer):
    """`/ws/sessions/{id}/`: one session, for its owner or staff."""

    async def connect(self) -> None:
        user = await self._signed_in_user()
        if user is None:
            return
        self.session_id = str(self.scope["url_route"]["kwargs"]["session_id"])
        if not await _may_see(user, self.session_id):
            await self._refuse(CLOSE_FORBIDDEN)
            return
        await self._join([session_group(self.session_id)])

    def still_permitted(self, user: Any) -> bool:
        # Staff watching another user's session, demoted since: closed (4403).
        return _visible(user, self.session_id)
