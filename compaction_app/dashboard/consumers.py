"""Websocket consumers for the dashboard: the same ledger messages as the JSON consumers, sent
as HTML fragments for htmx's ws extension (each top-level element carries hx-swap-oob and an
id, so htmx swaps it in place).

The fragments are the views' own template partials, rendered in a worker thread (the ORM is
only touched inside database_sync_to_async).
"""

from __future__ import annotations

import logging
from typing import Any

from channels.db import database_sync_to_async

from compaction_app.dashboard.render import list_frame, session_frame
from compaction_app.realtime.consumers import SessionConsumer, SessionsConsumer
from sessions_app.errors import NotFound
from sessions_app.selectors import session_get

logger = logging.getLogger("compaction_app.dashboard")


def _csrf_cookie(scope: dict[str, Any]) -> str:
    # Forms inside pushed fragments carry the page's CSRF token like rendered ones do; the
    # cookie holds the (unmasked) secret, which Django accepts as a token.
    for name, value in scope.get("headers", []):
        if name == b"cookie":
            for part in value.decode("latin-1").split(";"):
                key, _, token = part.strip().partition("=")
                if key == "csrftoken":
                    return token
    return ""


@database_sync_to_async
def _session_html(
    user: Any, session_id: str, message: dict[str, Any], csrf_token: str
) -> str | None:
    try:
        session = session_get(user=user, session_id=session_id)
    except NotFound:
        return None  # deleted since, or no longer visible
    return session_frame(session=session, user=user, message=message, csrf_token=csrf_token)


@database_sync_to_async
def _row_html(user: Any, session_id: str) -> str | None:
    try:
        session = session_get(user=user, session_id=session_id)
    except NotFound:
        return None
    return list_frame(session=session, user=user)


async def _push(consumer: SessionConsumer | SessionsConsumer, frame: Any, *, failure: str) -> None:
    """Send the rendered fragment, if any; a fragment that fails to render is logged and
    skipped (the page keeps what it shows)."""
    try:
        html = await frame
    except Exception:
        logger.exception(failure)
        return
    if html:
        await consumer.send(text_data=html)


class DashboardSessionsConsumer(SessionsConsumer):
    """`/ws/dashboard/sessions/`: the list page's rows (usage and compaction state)."""

    async def ledger_message(self, event: dict[str, Any]) -> None:
        message = event["message"]
        session_id = message.get("sessionId")
        if not session_id:
            return
        frame = _row_html(self.user, str(session_id))
        await _push(self, frame, failure=f"rendering a dashboard row for {session_id} failed")

    async def receive(
        self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs: Any
    ) -> None:
        return  # the page never sends; ignore anything that arrives


class DashboardSessionConsumer(SessionConsumer):
    """`/ws/dashboard/sessions/<id>/`: notices, gauge, chart, history, summary and timeline."""

    async def connect(self) -> None:
        self.user = self.scope.get("user")
        await super().connect()

    async def ledger_message(self, event: dict[str, Any]) -> None:
        message = event["message"]
        frame = _session_html(self.user, self.session_id, message, _csrf_cookie(self.scope))
        failure = f"rendering a dashboard frame for {self.session_id} failed"
        await _push(self, frame, failure=failure)

    async def receive(
        self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs: Any
    ) -> None:
        return
