"""Reads for the MCP tools: the session a call names, an event by seq, the latest loss report.

A session is named the way the gateway names it (`X-Ledger-Session`): its id, or the client
key the gateway stored on it. Unlike the gateway, naming never creates a session here.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser

from compaction_app.models import CompactionRun
from compaction_app.selectors import latest_completed_run
from sessions_app.errors import NotFound
from sessions_app.models import Event, Session
from sessions_app.selectors import sessions_visible_to
from sessions_app.storable import storable_text

User = AbstractBaseUser | AnonymousUser


def session_named(*, user: User, name: str | None) -> Session:
    """The session `name` stands for among those `user` may see (staff: all): a session id,
    else a gateway client key (the caller's own first). No name: the caller's own most
    recently active session. Another user's session is indistinguishable from none."""
    visible = sessions_visible_to(user=user)
    key = (name or "").strip()
    if not key:
        latest = visible.filter(owner_id=user.pk).order_by("-updated_at").first()
        if latest is None:
            raise NotFound("you have no sessions yet", code="not_found")
        return latest
    if storable_text(key) != key:
        # A NUL or a lone surrogate names no session (no key is stored with one), and
        # PostgreSQL refuses the NUL in a query: a bug's 500 rather than the 404 it is.
        raise NotFound("session not found")
    try:
        session_id: uuid.UUID | None = uuid.UUID(key)
    except ValueError:
        session_id = None
    if session_id is not None:
        found = visible.filter(pk=session_id).first()
        if found is not None:
            return found
    # A client key is unique per owner; staff may name another user's key too.
    by_key = visible.filter(client_key=key)
    found = by_key.filter(owner_id=user.pk).first() or by_key.order_by("-updated_at").first()
    if found is None:
        raise NotFound("session not found")
    return found


def event_at(*, session: Session, seq: int) -> Event:
    event = Event.objects.filter(session=session, seq=seq).first()
    if event is None:
        raise NotFound("event not found")
    return event


def latest_loss_report_run(*, session: Session) -> CompactionRun:
    """The run whose loss report the session page shows: the newest completed, not reverted
    run (its report may hold nothing: a run that folded nothing, or no evidence)."""
    run = latest_completed_run(session=session)
    if run is None:
        raise NotFound(
            "this session has no completed compaction that is not reverted",
            code="no_loss_report",
        )
    return run


def recent_sessions(*, user: User, limit: int) -> list[Any]:
    """The sessions `user` may see, newest activity first."""
    return list(
        sessions_visible_to(user=user).select_related("owner").order_by("-updated_at")[:limit]
    )
