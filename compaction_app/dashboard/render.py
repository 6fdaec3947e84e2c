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
from compaction_app.dashboard.chart import chart_geometry, input_bars
from compaction_app.models import CompactionRun
from sessions_app.models import Session

SESSION_TEMPLATE = "dashboard/session.html"
SESSIONS_TEMPLATE = "dashboard/sessions.html"

# Every live part of the session page, in page order.
SESSION_PARTS = ("gauge", "chart", "summary", "timeline", "history")


def chart_context(*, session: Session, schedule: queries.Schedule, axis: str) -> dict[str, Any]:
    """The chart twice: a wide drawing and a narrow one for phones (fewer ticks, text that
    stays legible when the SVG is not scaled down); CSS shows one of them."""
    series = queries.chart_series(session=session)
    if not series.points:
        return {"series": series, "geometry": None, "chart_variants": [], "axis": axis}
    thresholds = [
        (schedule.compact_ratio, f"compact {schedule.compact_percent} %"),
        (schedule.hard_ratio, f"hard limit {schedule.hard_percent} %"),
    ]
    limit = session.context_limit
    wide = chart_geometry(series=series, limit=limit, thresholds=thresholds, axis=axis)
    narrow = chart_geometry(
        series=series,
        limit=limit,
        thresholds=thresholds,
        axis=axis,
        width=360,
        height=220,
        pad_left=60,  # room for "100,000" at the legible size
        pad_right=14,
        pad_bottom=30,
        y_tick_count=2,
        x_tick_count=2,
    )
    calls = queries.call_inputs(session=session)
    return {
        "series": series,
        "axis": axis,
        # The input each provider call read, cached (bottom) and not (top), under the chart:
        # drawn once some call reported a cache read (the page's height is budgeted).
        "input_bars": input_bars(calls, height=28, pad_top=2, pad_bottom=2),
        "cached_calls": sum(1 for call in calls if call.cached_tokens),
        "geometry": wide,
        "chart_variants": [{"variant": "wide", "geo": wide}, {"variant": "narrow", "geo": narrow}],
    }


def session_context(
    *,
    session: Session,
    user: Any,
    show_all: bool = False,
    axis: str = "seq",
    before: int | None = None,
    all_runs: bool | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """The context every session-page partial renders from (`before`: an "earlier" window of
    the timeline alone, which needs nothing else; `all_runs`: every run in the history, by
    default as `show_all` says)."""
    if before is not None:
        timeline = queries.timeline(session=session, before=before)
        return {
            "session": session,
            "timeline": timeline,
            "cite_base": "?all=1",
            "is_staff": bool(getattr(user, "is_staff", False)),
            "user": user,
            **extra,
        }
    view = queries.session_view(
        session=session, all_runs=show_all if all_runs is None else all_runs
    )
    timeline = queries.timeline(session=session, show_all=show_all)
    return {
        "session": session,
        "view": view,
        "usage": view.usage,
        "row": view.row,
        "schedule": view.schedule,
        **chart_context(
            session=session, schedule=view.schedule, axis="time" if axis == "time" else "seq"
        ),
        "timeline": timeline,
        # Where a citation's event lives: this page, or the full list when it is cut short.
        "cite_base": "" if timeline.shown_all else "?all=1",
        "detail": None,
        "loss_run": latest_loss_run(view.runs),
        "is_staff": bool(getattr(user, "is_staff", False)),
        "user": user,
        **extra,
    }


def latest_loss_run(runs: Iterable[CompactionRun]) -> CompactionRun | None:
    """The newest completed, not reverted run that has a loss report with anything in it (a
    run that folded nothing has nothing to report)."""
    for run in runs:
        report = run.loss_report or {}
        if run.status == "completed" and report.get("evidenceBefore") and not run.reverted_at:
            return run
    return None


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
    elif kind == "COMPACTION_PENDING":
        extra.update(
            notice_context(
                f"Context at {message.get('percentUsed')} %: an automatic compaction is about "
                "to start. Pin any event that must stay.",
                level="warn",
            )
        )
        parts = ["notice", "gauge"]
    elif kind == "COMPACTION_COMPLETE":
        success = bool(message.get("success"))
        extra.update(
            notice_context(
                str(message.get("message") or ""), level="success" if success else "error"
            )
        )
        parts = ["notice", "controls", *SESSION_PARTS]
    elif kind == "COMPACTION_REVERTED":
        extra.update(
            notice_context(
                "Compaction reverted: the folded events are active again "
                f"({message.get('tokensBefore') or 0:,} → {message.get('tokensAfter') or 0:,} "
                "tokens).",
                level="success",
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
