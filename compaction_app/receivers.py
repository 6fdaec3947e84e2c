"""Receivers for sessions_app's signals: how the ledger reaches compaction."""

from __future__ import annotations

import logging
from typing import Any

from django.dispatch import receiver

from compaction_app import services
from compaction_app.api.serializers import run_to_dict
from compaction_app.models import Trigger
from sessions_app.errors import Conflict, ServiceUnavailable
from sessions_app.models import EventType, Session
from sessions_app.signals import (
    compaction_command,
    events_appended,
    session_compaction_requested,
    token_counts_updated,
)

logger = logging.getLogger("compaction_app")

_INTERNAL_TYPES = {EventType.COMPACTION, EventType.CONTEXT_REFRESH}


@receiver(events_appended)
def on_events_appended(
    sender: Any, *, session_id: Any, event_types: list[str], session: Session, **kwargs: Any
) -> None:
    if set(event_types) <= _INTERNAL_TYPES:
        return  # appended by a compaction run, which announces its own usage
    # This runs after the append committed, still inside the client's request: whatever
    # goes wrong here is logged, never turned into an error for an append that succeeded.
    try:
        services.broadcast_usage(session)
    except Exception:
        logger.exception("usage broadcast after an append failed for session %s", session_id)
    services.maybe_auto_compact(session_id=session_id, session=session)


@receiver(compaction_command)
def on_compaction_command(
    sender: Any, *, session: Session, user: Any, arguments: list[str], **kwargs: Any
) -> dict:
    strategy = arguments[0] if arguments else None
    run = services.compaction_request(
        session=session, user=user, trigger=Trigger.MANUAL, strategy=strategy
    )
    return run_to_dict(run)


@receiver(session_compaction_requested)
def on_admin_compaction(
    sender: Any, *, session_ids: list[Any], user: Any, **kwargs: Any
) -> list[str]:
    started = []
    for session in Session.objects.filter(pk__in=session_ids):
        try:
            started.append(
                str(
                    services.compaction_request(
                        session=session, user=user, trigger=Trigger.MANUAL
                    ).pk
                )
            )
        except (Conflict, ServiceUnavailable):
            continue
    return started


@receiver(token_counts_updated)
def on_token_counts_updated(sender: Any, *, session: Session, **kwargs: Any) -> None:
    # Exact counts replaced local ones: the totals moved, so watchers get the new usage.
    try:
        services.broadcast_usage(session)
    except Exception:
        logger.exception("usage broadcast after exact counts failed for session %s", session.pk)
