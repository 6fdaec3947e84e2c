from __future__ import annotations

import uuid
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models import QuerySet

from compaction_app.models import CompactionRun, RunningSummary, RunStatus
from sessions_app.errors import NotFound
from sessions_app.models import Session
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
