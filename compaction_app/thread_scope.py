"""Which events a compaction of one thread sees (selectors, read only).

A run with a `thread` plans over that thread's events only: those recorded with its key in
`metadata["thread"]` (its COMPACTION events carry it too), and for the session's main thread
also the events recorded without a thread (the REST API, an import, a run over the whole
ledger). A system prompt several threads share belongs to the thread that sent it first.
A run without a thread plans over the whole ledger, as before threads existed.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db.models import Q, QuerySet

from sessions_app import scope
from sessions_app.errors import InvalidInput
from sessions_app.models import Event, EventType, Session
from sessions_app.threads import main_thread, session_threads

logger = logging.getLogger("compaction_app")


def scoped(queryset: QuerySet[Event], *, session: Session, thread: str) -> QuerySet[Event]:
    """`queryset` narrowed to the thread's events ("" : the whole session)."""
    if not thread:
        return queryset
    own = Q(metadata__thread=thread)
    main = main_thread(session=session)
    if main is not None and main.key == thread:
        own |= ~Q(metadata__has_key="thread")
    return queryset.filter(own)


def previous_summary(*, session: Session, thread: str) -> str:
    """The thread's latest summary (what its next summarize run extends): the text of its
    latest COMPACTION event that is not reverted and says something, as the session's
    running summary does for a run over the whole ledger."""
    events = Event.objects.filter(session=session, type=EventType.COMPACTION, reverted=False)
    latest = (
        scoped(events, session=session, thread=thread)
        .exclude(content="")
        .order_by("-seq")
        .values_list("content", flat=True)
        .first()
    )
    return latest or ""


def summary_scores(*, session: Session, thread: str, text: str) -> dict[str, int]:
    """What the items of the summary `text` scored when they were chosen: kept in the
    metadata of the COMPACTION event that holds it (the thread's, or the session's running
    summary's), {} when none does."""
    if not text:
        return {}
    events = Event.objects.filter(session=session, type=EventType.COMPACTION, reverted=False)
    metadata = (
        scoped(events, session=session, thread=thread)
        .filter(content=text)
        .order_by("-seq")
        .values_list("metadata", flat=True)
        .first()
    )
    scores = (metadata or {}).get("summaryScores") if isinstance(metadata, dict) else None
    if not isinstance(scores, dict):
        return {}
    return {str(k): int(v) for k, v in scores.items() if isinstance(v, int | float)}


def keeps_running_summary(*, session: Session, thread: str) -> bool:
    """Whether a run updates the session's running summary: a run over the whole ledger and
    one of the main thread do (the session's summary is its main thread's); a side thread's
    summary lives in its COMPACTION events only."""
    if not thread:
        return True
    main = main_thread(session=session)
    return main is None or main.key == thread


def requested_thread(*, session: Session, key: str | None) -> str:
    """The thread a compaction asked for over REST compacts: the named one, else the main
    thread of a session with threads, else the whole ledger (""). An unknown key is refused."""
    threads = session_threads(session=session)
    if key is None:
        return threads[0].key if threads else ""
    if not any(t.key == key for t in threads):
        raise InvalidInput(
            "thread is not a thread of this session",
            code="unknown_thread",
            fields={"thread": "no such thread in this session"},
        )
    return key


def forget_threads(*, session_id: Any) -> None:
    """The usage push's cached knowledge of the session's threads is stale (sessions_app.scope
    keeps it)."""
    scope.forget_threads(session_id=session_id)
