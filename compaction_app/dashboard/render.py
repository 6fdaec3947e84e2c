"""Rendering of the dashboard's template partials, for views and websocket consumers alike.

A partial is one `{% partialdef %}` of `dashboard/session.html` or `dashboard/sessions.html`;
the same partial is the htmx response of a view and a frame pushed over the websocket (there
marked `hx-swap-oob` so htmx's ws extension swaps it in place by id).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from django.template.loader import render_to_string

from compaction_app.dashboard import queries
from compaction_app.dashboard.chart import chart_geometry
from compaction_app.models import CompactionRun
from sessions_app.models import Session

SESSION_TEMPLATE = "dashboard/session.html"
SESSIONS_TEMPLATE = "dashboard/sessions.html"

# Every live part of the session page, in page order.
SESSION_PARTS = ("gauge", "chart", "history", "summary", "timeline")


def session_context(
    *, session: Session, user: Any, show_all: bool = False, **extra: Any
) -> dict[str, Any]:
    """The context every session-page partial renders from."""
    view = queries.session_view(session=session)
    series = queries.chart_series(session=session)
    return {
        "session": session,
        "view": view,
        "usage": view.usage,
        "row": view.row,
        "geometry": chart_geometry(series=series, limit=session.context_limit)
        if series.points
        else None,
        "series": series,
        "timeline": queries.timeline(session=session, show_all=show_all),
        "is_staff": bool(getattr(user, "is_staff", False)),
        "user": user,
        **extra,
    }


def render_parts(
    template: str,
    parts: Iterable[str],
    context: Mapping[str, Any],
    *,
    request: Any = None,
    oob: bool = True,
) -> str:
    """Render named partials of `template`, one after another; with `oob` each carries
    hx-swap-oob so a single response or frame can update several places."""
    ctx = {**context, "oob": oob}
    return "".join(render_to_string(f"{template}#{part}", ctx, request=request) for part in parts)


def notice_context(text: str, *, level: str = "info") -> dict[str, Any]:
    return {"notice_text": text, "notice_level": level}


def session_frame(
    *, session: Session, user: Any, message: Mapping[str, Any], csrf_token: str = ""
) -> str:
    """The HTML frame a session page receives for one ledger message."""
    kind = message.get("type")
    extra: dict[str, Any] = {"csrf_token": csrf_token}
    parts: list[str] = list(SESSION_PARTS)
    if kind == "COMPACTION_START":
        extra.update(
            notice_context(
                str(message.get("message") or "Compacting conversation to reduce size…"),
                level="info",
            )
        )
        parts = ["notice", "gauge", "controls", "history"]
    elif kind == "COMPACTION_COMPLETE":
        success = bool(message.get("success"))
        extra.update(
            notice_context(
                str(message.get("message") or ""), level="success" if success else "error"
            )
        )
        parts = ["notice", "controls", *SESSION_PARTS]
    elif kind == "CONTEXT_COMPRESSED":
        extra.update(
            notice_context(
                f"Context compressed for the model: {message.get('originalTokenCount')} → "
                f"{message.get('compressedTokenCount')} tokens (gateway)",
                level="info",
            )
        )
        parts = ["notice", *SESSION_PARTS]
    context = session_context(session=session, user=user, **extra)
    return render_parts(SESSION_TEMPLATE, parts, context)


def row_context(*, session: Session, user: Any) -> dict[str, Any]:
    active = queries.active_runs_by_session([session.pk]).get(session.pk)
    return {"row": queries.session_row(session=session, active_run=active), "user": user}


def list_frame(*, session: Session, user: Any) -> str:
    """The HTML frame the sessions list receives: the session's row, swapped by id."""
    return render_parts(SESSIONS_TEMPLATE, ["row"], row_context(session=session, user=user))


def run_label(run: CompactionRun) -> str:
    return f"{run.strategy} ({run.trigger})"
