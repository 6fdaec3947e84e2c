"""Websocket consumers: live compaction and usage events, per user or per session."""

from __future__ import annotations

import logging
from typing import Any

from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from compaction_app import metrics
from compaction_app.realtime import messages, ws_limits
from compaction_app.realtime.broadcast import STAFF_GROUP, session_group, user_group
from compaction_app.realtime.revocation import CLOSE_FORBIDDEN, RevocableConsumerMixin
from sessions_app.errors import NotFound
from sessions_app.selectors import session_get

CLOSE_UNAUTHENTICATED = 4401

logger = logging.getLogger("compaction_app.realtime")


def _visible(user: Any, session_id: str) -> bool:
    try:
        session_get(user=user, session_id=session_id)
    except NotFound:
        return False
    return True


_may_see = database_sync_to_async(_visible)


class _LedgerConsumer(RevocableConsumerMixin, AsyncJsonWebsocketConsumer):
    groups_joined: list[str]
    slot: ws_limits.Slot | None = None

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
        # One of the user's socket slots first (ws_limits.py): past them, 4429.
        if not await self._take_slot():
            await self._refuse(ws_limits.CLOSE_TOO_MANY)
            return
        # Plus the groups whose revocation closes this socket with 4401 (revocation.py).
        groups = [*groups, *self.revocation_groups()]
        self.groups_joined = []
        try:
            for group in groups:
                self.groups_joined.append(group)
                await self.channel_layer.group_add(group, self.channel_name)
        except Exception as exc:
            # The layer's Redis is full (OOM) or out of connections: a clean refusal the
            # client may retry, never a 500 handshake (issue 42, row 11).
            logger.warning("websocket refused, the channel layer failed: %r", exc)
            await self._leave_groups()
            await self._give_slot_back()
            await self._refuse(ws_limits.CLOSE_TRY_AGAIN)
            return
        await self.accept()
        self.start_rechecks()
        self.counted = True
        metrics.websocket_changed(+1)

    async def _take_slot(self) -> bool:
        if not ws_limits.limited():
            return True
        user = self.scope["user"]
        try:
            self.slot = await sync_to_async(ws_limits.take, thread_sensitive=False)(user.pk)
        except ws_limits.CACHE_ERRORS as exc:
            ws_limits.unreachable(exc)
            return True
        return self.slot is not None

    async def _give_slot_back(self) -> None:
        slot, self.slot = self.slot, None
        if slot is not None:
            try:
                await sync_to_async(ws_limits.give_back, thread_sensitive=False)(slot)
            except ws_limits.CACHE_ERRORS as exc:
                logger.warning("websocket slot not given back (it expires): %s", exc)

    async def _leave_groups(self) -> None:
        for group in getattr(self, "groups_joined", []):
            try:
                await self.channel_layer.group_discard(group, self.channel_name)
            except Exception as exc:  # the group's membership expires on its own
                logger.warning("websocket group not left: %r", exc)
        self.groups_joined = []

    async def recheck(self) -> bool:
        stays = await super().recheck()
        if stays and self.slot is not None:
            try:
                await sync_to_async(ws_limits.refresh, thread_sensitive=False)(self.slot)
            except ws_limits.CACHE_ERRORS as exc:
                logger.warning("websocket slot not refreshed: %s", exc)
        return stays

    async def disconnect(self, code: int) -> None:
        if getattr(self, "counted", False):
            self.counted = False
            metrics.websocket_changed(-1)
        await self._leave_groups()
        await self._give_slot_back()

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
