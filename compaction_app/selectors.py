from __future__ import annotations

import uuid
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models import QuerySet

from compaction_app.models import CompactionRun, RunningSummary, RunStatus
from sessions_app.errors import NotFound
from sessions_app.models import Event, EventType, Session
from sessions_app.selectors import sessions_visible_to


def runs_for_session(*, session: Session) -> QuerySet[CompactionRun]:
    return CompactionRun.objects.filter(session=session).order_by("-created_at")


def latest_revertible_run(*, session: Session) -> CompactionRun | None:
    """The only run of the session a revert may undo: its latest completed, not yet reverted
    run that folded something (a run with no COMPACTION event has nothing to undo)."""
    return (
        CompactionRun.objects.filter(
            session=session,
            status=RunStatus.COMPLETED,
            reverted_at__isnull=True,
            compaction_event__isnull=False,
        )
        .order_by("-finished_at", "-created_at")
        .first()
    )


def run_get(*, user: AbstractBaseUser | AnonymousUser, run_id: Any) -> CompactionRun:
    """A run of a session the user may see (another user's → not found)."""
    try:
        key = uuid.UUID(str(run_id))
        return CompactionRun.objects.select_related("session").get(
            pk=key, session__in=sessions_visible_to(user=user)
        )
    except (ValueError, CompactionRun.DoesNotExist):
        raise NotFound("compaction not found") from None


def running_summary_get(*, session: Session) -> RunningSummary:
    summary = RunningSummary.objects.filter(session=session).exclude(summary="").first()
    if summary is None:
        raise NotFound("this session has no summary yet", code="no_summary")
    return summary


def summary_message_tokens(*, session: Session) -> int | None:
    """What the running summary costs in the context: its COMPACTION event's tokenCount (the
    summary text plus the message framing), the figure the dashboard's summary card and the
    timeline's summary entry show. The running summary is the main thread's (thread_scope)."""
    from compaction_app import thread_scope
    from sessions_app.threads import main_thread

    main = main_thread(session=session)
    events = Event.objects.filter(
        session=session, type=EventType.COMPACTION, reverted=False, compacted_by__isnull=True
    ).exclude(content="")
    scoped = thread_scope.scoped(events, session=session, thread=main.key if main else "")
    return scoped.order_by("-seq").values_list("token_count", flat=True).first()


def latest_completed_run(*, session: Session) -> CompactionRun | None:
    """The session's newest completed run that is not reverted, whatever it did: the run the
    "what this compaction dropped" panel and the loss-report resource describe."""
    return (
        CompactionRun.objects.filter(
            session=session, status=RunStatus.COMPLETED, reverted_at__isnull=True
        )
        .order_by("-finished_at", "-created_at")
        .first()
    )
