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
from compaction_app.realtime import messages
from compaction_app.selectors import latest_completed_run
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
        **_loss_context(session),
        "is_staff": bool(getattr(user, "is_staff", False)),
        "user": user,
        **extra,
    }


def _loss_context(session: Session) -> dict[str, Any]:
    run = latest_completed_run(session=session)
    return {"loss_run": run, "loss_state": loss_state(run)}


def loss_state(run: CompactionRun | None) -> str:
    """What the loss panel says of the latest completed run: "report" (it folded evidence),
    "no_evidence" (it folded events that held none), "nothing_folded", or "none" (no
    completed run, or every one reverted)."""
    if run is None:
        return "none"
    report = run.loss_report or {}
    if report.get("evidenceBefore"):
        return "report"
    return "no_evidence" if run.folded_count else "nothing_folded"


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
    """The HTML frame a session page receives for one ledger message, read by its type
    (compaction_app.realtime.messages)."""
    extra: dict[str, Any] = {"csrf_token": csrf_token}
    parts: list[str] = list(SESSION_PARTS)
    try:
        known = messages.parse(message)
    except ValueError:
        known = None  # not one of ours: the page's figures are refreshed all the same
    if isinstance(known, messages.CompactionStart):
        extra.update(notice_context(known.message, level="info"))
        parts = ["notice", "gauge", "controls", "history"]
    elif isinstance(known, messages.CompactionPending):
        extra.update(
            notice_context(
                f"Context at {known.percentUsed} %: an automatic compaction is about "
                "to start. Pin any event that must stay.",
                level="warn",
            )
        )
        parts = ["notice", "gauge"]
    elif isinstance(known, messages.CompactionComplete):
        # A run that changed nothing is no success to celebrate: said plainly, in neutral.
        level = (
            "error"
            if not known.success
            else "info"
            if known.outcome == "nothing_to_fold"
            else "success"
        )
        extra.update(notice_context(known.message, level=level))
        parts = ["notice", "controls", *SESSION_PARTS]
    elif isinstance(known, messages.CompactionReverted):
        extra.update(
            notice_context(
                "Compaction reverted: the folded events are active again "
                f"({known.tokensBefore:,} → {known.tokensAfter:,} tokens).",
                level="success",
            )
        )
        parts = ["notice", "controls", *SESSION_PARTS]
    elif isinstance(known, messages.ContextCompressed):
        extra.update(
            notice_context(
                f"Context compressed for the model: {known.originalTokenCount:,} → "
                f"{known.compressedTokenCount:,} tokens (gateway)",
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
