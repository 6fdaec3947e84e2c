"""Dashboard views: thin function views (validate, call a selector or service, render).

An htmx request gets the template partial it asked for; a plain request gets the whole page
(every page renders its data without JavaScript). Staff-only actions answer 403 to anyone
else, whatever the form says.
"""

from __future__ import annotations

from functools import wraps
from typing import Any

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST
from django_htmx.middleware import HtmxDetails

from compaction_app import services as compaction_services
from compaction_app.call_story import call_story_document
from compaction_app.dashboard import calls as dashboard_calls
from compaction_app.dashboard import queries
from compaction_app.dashboard import usage as usage_page
from compaction_app.dashboard.render import (
    SESSION_PARTS,
    SESSION_TEMPLATE,
    SESSIONS_TEMPLATE,
    notice_context,
    render_parts,
    session_context,
)
from compaction_app.dashboard.timezone import viewer_zone
from compaction_app.models import CompactionRun
from compaction_app.run_documents import nothing_to_fold_reason, trim_target
from compaction_app.selectors import run_get
from sessions_app import search as session_search_module
from sessions_app import services as session_services
from sessions_app.errors import LedgerError, NotFound
from sessions_app.models import Session
from sessions_app.selectors import event_get, session_get
from sessions_app.session_settings import STRATEGY_NAMES
from sessions_app.threads import session_threads


class HtmxHttpRequest(HttpRequest):
    """A request after django-htmx's middleware (for the type checker)."""

    htmx: HtmxDetails


def _session_or_404(request: HtmxHttpRequest, session_id: Any) -> Session:
    try:
        return session_get(user=request.user, session_id=session_id)
    except NotFound:
        raise Http404("session not found") from None


def _run_or_404(request: HtmxHttpRequest, session: Session, run_id: Any) -> CompactionRun:
    """One of this session's runs, visible to the user; anything else is a 404."""
    try:
        run = run_get(user=request.user, run_id=run_id)
    except NotFound:
        raise Http404("compaction not found") from None
    if run.session_id != session.pk:
        raise Http404("compaction not found")
    return run


def staff_required(view: Any) -> Any:
    """Login first (anonymous → login page), then staff (others → 403)."""

    @login_required
    @wraps(view)
    def wrapper(request: HtmxHttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not request.user.is_staff:
            raise PermissionDenied("staff only")
        return view(request, *args, **kwargs)

    return wrapper


@login_required
@require_GET
def sessions_list(request: HtmxHttpRequest) -> HttpResponse:
    filters = queries.ListFilters.from_query(request.GET)
    page, rows = queries.sessions_page(user=request.user, filters=filters)
    context = {
        "page": page,
        "rows": rows,
        "filters": filters,
        "prev_qs": filters.query_string(page=page.previous_page_number())
        if page.has_previous()
        else None,
        "next_qs": filters.query_string(page=page.next_page_number()) if page.has_next() else None,
        "models": queries.models_in_use(user=request.user),
        "sorts": [
            ("-updated", "Recently updated"),
            ("-usage", "Usage (highest first)"),
            ("usage", "Usage (lowest first)"),
            ("title", "Title"),
            ("model", "Model"),
            ("-events", "Events (most first)"),
            ("-tokens", "Reported tokens (most first)"),
        ],
    }
    if request.htmx and request.htmx.target == "sessions-table":
        return render(request, f"{SESSIONS_TEMPLATE}#table", context)
    if not page.paginator.count and not (filters.q or filters.model or filters.near):
        context.update(get_started_context(request))
    return render(request, SESSIONS_TEMPLATE, context)


def get_started_context(request: HtmxHttpRequest) -> dict[str, Any]:
    """What the get-started panel shows: the user's own API token and this server's URLs."""
    return {
        "get_started": True,
        "api_token": queries.api_token_of(user=request.user),
        "gateway_openai": request.build_absolute_uri("/gateway/openai/v1"),
        "gateway_anthropic": request.build_absolute_uri("/gateway/anthropic"),
        "api_root": request.build_absolute_uri("/api/v1/"),
    }


@login_required
@require_GET
def get_started(request: HtmxHttpRequest) -> HttpResponse:
    """The get-started panel on its own page (the empty sessions list shows it too)."""
    return render(request, "dashboard/get_started.html", get_started_context(request))


def _page_options(request: HtmxHttpRequest) -> dict[str, Any]:
    return {
        "show_all": request.GET.get("all") == "1",
        "axis": "time" if request.GET.get("axis") == "time" else "seq",
    }


def _session_page(
    request: HtmxHttpRequest, session: Session, *, status: int = 200, **extra: Any
) -> HttpResponse:
    context = session_context(
        session=session, user=request.user, oob=False, **_page_options(request), **extra
    )
    context["threads"] = session_threads(session=session)  # the gateway's writers, main first
    return render(request, SESSION_TEMPLATE, context, status=status)


def _part(request: HtmxHttpRequest, session: Session, part: str, **extra: Any) -> HttpResponse:
    """One part of the session page alone, for htmx to swap in place."""
    context = session_context(session=session, user=request.user, **extra)
    return HttpResponse(render_parts(SESSION_TEMPLATE, [part], context, request=request, oob=False))


def _positive_int(value: str | None) -> int | None:
    try:
        number = int(value) if value else None
    except ValueError:
        return None
    return number if number is not None and number > 0 else None


# htmx targets the session page may ask for by themselves.
PAGE_PARTS = {
    "timeline": "timeline",
    "chart": "chart",
    "run-detail": "run_detail",
    # "show all" runs: the history alone, every run in it, swapped in place.
    "history": "history",
}


@login_required
@require_GET
def session_detail(request: HtmxHttpRequest, session_id: Any) -> HttpResponse:
    session = _session_or_404(request, session_id)
    before = _positive_int(request.GET.get("before"))
    if before is not None:
        # The "earlier" link: the window of the trace before `before`, as the one fragment
        # the page itself renders its latest window with (a plain request gets it too).
        return _part(request, session, "timeline_items", before=before, **_page_options(request))
    part = PAGE_PARTS.get(request.htmx.target or "") if request.htmx else None
    if part is not None:
        options = _page_options(request)
        if part == "history":
            # Every run, without the whole conversation the page's ?all=1 also renders.
            options.update(all_runs=options["show_all"], show_all=False)
        return _part(request, session, part, **options)
    return _session_page(request, session)


def _calls(request: HtmxHttpRequest, session: Session | None) -> HttpResponse:
    try:
        context = dashboard_calls.calls_page(user=request.user, params=request.GET, session=session)
    except dashboard_calls.BadFilter as exc:
        context = {
            "error": str(exc),
            "session": session,
            "values": {name: request.GET.get(name, "")[:200] for name in dashboard_calls.FIELDS},
            "statuses": dashboard_calls.CallStatus.values,
        }
        return render(request, "dashboard/calls.html", context, status=400)
    return render(request, "dashboard/calls.html", context)


@login_required
@require_GET
def calls_list(request: HtmxHttpRequest) -> HttpResponse:
    """Every gateway call of the sessions the user may see (staff: every user's)."""
    return _calls(request, None)


@login_required
@require_GET
def call_detail(request: HtmxHttpRequest, call_id: Any) -> HttpResponse:
    """One call's story: the request as sent and as forwarded, side by side, each message's
    fate, the reply, headers, usage and cost by kind, latency, links."""
    try:
        call, story = call_story_document(user=request.user, call_id=call_id)
    except NotFound:
        raise Http404("call not found") from None
    return render(request, "dashboard/call.html", queries.call_page(call=call, story=story))


@login_required
@require_GET
def usage(request: HtmxHttpRequest) -> HttpResponse:
    """Usage over time: calls, tokens, cost, cache hit rate, latency and errors per hour or
    day in the viewer's zone, grouped by model, user, session or status."""
    try:
        context = usage_page.page(user=request.user, params=request.GET, tz=viewer_zone(request))
    except usage_page.BadUsage as exc:
        return render(request, "dashboard/usage.html", {"error": str(exc)}, status=400)
    return render(request, "dashboard/usage.html", context)


@login_required
@require_GET
def session_calls(request: HtmxHttpRequest, session_id: Any) -> HttpResponse:
    """One session's gateway calls."""
    return _calls(request, _session_or_404(request, session_id))


@login_required
@require_GET
def compaction_detail(request: HtmxHttpRequest, session_id: Any, run_id: Any) -> HttpResponse:
    """A run's before / after: the panel alone for htmx, else the session page with it open."""
    session = _session_or_404(request, session_id)
    run = _run_or_404(request, session, run_id)
    detail = queries.run_detail(run=run)
    if request.htmx:
        return _part(request, session, "run_detail", detail=detail, **_page_options(request))
    return _session_page(request, session, detail=detail)


@staff_required
@require_POST
def auto_compact_toggle(request: HtmxHttpRequest, session_id: Any) -> HttpResponse:
    """Switch the session's auto compaction on or off (staff, like "Compact now")."""
    session = _session_or_404(request, session_id)
    enabled = request.POST.get("enabled") == "1"
    session = session_services.session_update(session=session, settings={"autoCompact": enabled})
    if request.htmx:
        state = "on" if enabled else "off"
        return _htmx_parts(
            request,
            session,
            ["gauge"],
            **notice_context(f"Auto compaction is {state}.", level="success"),
        )
    return redirect(reverse("dashboard:session", args=[session.pk]))


def _htmx_parts(
    request: HtmxHttpRequest, session: Session, parts: list[str], **extra: Any
) -> HttpResponse:
    """The answer to an htmx POST: the notice swapped into #notice (the request's target),
    and the other parts out of band. The notice is the main swap because the form that asked
    may have been replaced by a websocket push meanwhile, and htmx only finds out-of-band
    targets from a form that is still in the page."""
    context = session_context(session=session, user=request.user, **extra)
    html = render_parts(SESSION_TEMPLATE, ["notice"], context, request=request, oob=False)
    others = [part for part in parts if part != "notice"]
    html += render_parts(SESSION_TEMPLATE, others, context, request=request)
    return HttpResponse(html)


def _error(request: HtmxHttpRequest, session: Session, exc: LedgerError) -> HttpResponse:
    text = f"Could not do that: {exc.detail}"
    if request.htmx:
        # htmx does not swap 4xx answers; the notice is the answer, so send it as a 200.
        return _htmx_parts(request, session, ["notice"], **notice_context(text, level="error"))
    return _session_page(request, session, status=exc.status, **notice_context(text, level="error"))


@login_required
@require_GET
def session_search(request: HtmxHttpRequest, session_id: Any) -> HttpResponse:
    """Search the session's events, folded ones included: the results partial for htmx (as
    the user types), the whole page with the results otherwise."""
    session = _session_or_404(request, session_id)
    text = request.GET.get("q", "").strip()[: session_search_module.MAX_QUERY_CHARS]
    try:
        hits = session_search_module.search_session(session=session, text=text) if text else []
    except LedgerError:
        hits = []
    if request.htmx:
        context = {"session": session, "search_q": text, "search_hits": hits}
        return render(request, "dashboard/_search.html#results", context)
    return _session_page(request, session, search_q=text, search_hits=hits)


@staff_required
@require_POST
def compaction_preview(request: HtmxHttpRequest, session_id: Any) -> HttpResponse:
    session = _session_or_404(request, session_id)
    strategy = request.POST.get("strategy", "")
    if strategy not in STRATEGY_NAMES:
        return _error(request, session, LedgerError(f"unknown strategy {strategy!r}"))
    dry_run = compaction_services.compaction_plan(session=session, strategy=strategy, project=True)
    preview: dict[str, Any] = {"plan": dry_run.plan, "strategy": strategy}
    if dry_run.plan.is_empty:
        # Say why, rather than offer a run that would change nothing.
        preview["why"] = nothing_to_fold_reason(
            strategy=strategy, tokens=dry_run.plan.tokens_before, target=trim_target(session)
        )
    if request.htmx:
        return _part(request, session, "controls", preview=preview)
    return _session_page(request, session, preview=preview)


@staff_required
@require_POST
def compaction_start(request: HtmxHttpRequest, session_id: Any) -> HttpResponse:
    session = _session_or_404(request, session_id)
    strategy = request.POST.get("strategy", "")
    if strategy not in STRATEGY_NAMES:
        return _error(request, session, LedgerError(f"unknown strategy {strategy!r}"))
    try:
        compaction_services.compaction_request(
            session=session, user=request.user, strategy=strategy
        )
    except LedgerError as exc:
        return _error(request, session, exc)
    if request.htmx:
        return _htmx_parts(
            request,
            session,
            ["notice", "controls", "history"],
            **notice_context(f"Compaction requested ({strategy}).", level="info"),
        )
    return redirect(reverse("dashboard:session", args=[session.pk]))


@staff_required
@require_POST
def compaction_revert(request: HtmxHttpRequest, session_id: Any, run_id: Any) -> HttpResponse:
    session = _session_or_404(request, session_id)
    run = _run_or_404(request, session, run_id)
    try:
        compaction_services.compaction_revert(run=run)
    except LedgerError as exc:
        return _error(request, session, exc)
    session.refresh_from_db()
    if request.htmx:
        return _htmx_parts(
            request,
            session,
            ["notice", *SESSION_PARTS],
            **notice_context(
                "Compaction reverted: the folded events are active again.", level="success"
            ),
        )
    return redirect(reverse("dashboard:session", args=[session.pk]))


@login_required
@require_POST
def event_pin(request: HtmxHttpRequest, session_id: Any, event_id: Any) -> HttpResponse:
    """Pin or unpin an event (the session's owner or staff, like the API)."""
    session = _session_or_404(request, session_id)
    try:
        event = event_get(session=session, event_id=event_id)
    except NotFound:
        raise Http404("event not found") from None
    session_services.event_set_pinned(event=event, pinned=request.POST.get("pinned") == "1")
    if request.htmx:
        verb = "pinned" if event.pinned else "unpinned"
        return _htmx_parts(
            request,
            session,
            ["timeline"],
            **notice_context(f"Event #{event.seq} {verb}.", level="success"),
        )
    return redirect(reverse("dashboard:session", args=[session.pk]) + f"#event-{event.seq}")
