"""Reads for the dashboard: session rows, the list's filters, the timeline, the chart's data.

Shared by the views and the websocket consumers, so a pushed fragment and a rendered page are
built from the same numbers.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.core.paginator import Page, Paginator
from django.db.models import (
    Case,
    Count,
    F,
    FloatField,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Value,
    When,
)
from django.db.models.fields.json import KT
from django.db.models.functions import Cast, Coalesce, Substr
from django.utils import timezone

from compaction_app.dashboard.chart import (
    CallInput,
    ChartCompaction,
    ChartEvent,
    Point,
    Series,
    context_series,
    stitched_series,
)
from compaction_app.dashboard.trace import EXPANDED_TAIL, Item, build_trace
from compaction_app.models import ACTIVE_STATUSES, CompactionRun, RunningSummary, RunStatus
from compaction_app.selectors import (
    latest_revertible_run,
    runs_for_session,
    summary_message_tokens,
)
from sessions_app import pricing, scope
from sessions_app.models import MODEL_INVISIBLE_TYPES, Event, EventType, Session, Thread
from sessions_app.scope import BillFigures, ContextFigures
from sessions_app.search import sessions_matching_content
from sessions_app.selectors import counter_is_exact, sessions_visible_to, usage_for_session
from sessions_app.session_settings import DEFAULTS as SETTING_DEFAULTS
from sessions_app.session_settings import STRATEGY_NAMES, SessionSettings
from sessions_app.threads import MAIN_NAME, session_threads, threads_by_session
from sessions_app.tokens import REPLY_PRIMER

PAGE_SIZE = 25
# The session page renders this many of the newest events; "earlier" loads the next window.
TIMELINE_WINDOW = 60
# Bar colours of the issue: amber from 80 %, red from 95 % of the window.
AMBER_PERCENT = 80.0
RED_PERCENT = 95.0
GAUGE_RADIUS = 52

# ?sort= values → ordering; a leading "-" in the value reverses.
SORTS: dict[str, tuple[str, ...]] = {
    "updated": ("updated_at",),
    "usage": ("ratio_used", "updated_at"),
    "title": ("title", "updated_at"),
    "model": ("model", "updated_at"),
    "events": ("event_count", "updated_at"),
    "tokens": ("reported_total_tokens", "updated_at"),
}
DEFAULT_SORT = "-updated"


def usage_level(percent: float) -> str:
    """The bar colour class for a usage percentage."""
    if percent >= RED_PERCENT:
        return "crit"
    if percent >= AMBER_PERCENT:
        return "warn"
    return "ok"


def _event_cost(model: str, event: Event) -> Decimal | None:
    """One reported call's price, cache reads and writes at their own rates (the model the
    reply names, else the session's)."""
    if not event.prompt_tokens and not event.completion_tokens:
        return None
    named = event.metadata.get("model") if isinstance(event.metadata, dict) else None
    price = pricing.price_call(
        named if isinstance(named, str) and named else model,
        pricing.CallUsage(
            input_tokens=event.prompt_tokens or 0,
            output_tokens=event.completion_tokens or 0,
            cached_input_tokens=event.cached_input_tokens or 0,
            cache_write_tokens=event.cache_write_tokens or 0,
        ),
    )
    return None if price.nano_usd is None else Decimal(price.nano_usd) / pricing.NANO_PER_USD


TITLE_CHARS = 80


def display_title(*, session: Session) -> str:
    """What the dashboard calls a session: its title; else (a session a client created) the
    gateway's client key; else the first line of its first user message. Display only: the
    stored title stays empty until someone sets one."""
    if session.title:
        return session.title
    if session.client_key:
        return session.client_key
    text = getattr(session, "first_user_text", None)
    if text is None:
        text = (
            Event.objects.filter(session=session, type=EventType.USER_MESSAGE)
            .order_by("seq")
            .values_list("content", flat=True)
            .first()
        )
    line = next((part.strip() for part in (text or "").splitlines() if part.strip()), "")
    if not line:
        return "(untitled)"
    return line if len(line) <= TITLE_CHARS else line[: TITLE_CHARS - 1] + "…"


def _with_first_user_text(queryset: QuerySet[Session]) -> QuerySet[Session]:
    """One subquery for the list's untitled rows, instead of one query per row."""
    first = (
        Event.objects.filter(session=OuterRef("pk"), type=EventType.USER_MESSAGE)
        .order_by("seq")
        .values("content")[:1]
    )
    return queryset.annotate(first_user_text=Substr(Subquery(first), 1, 400))


@dataclass
class SessionRow:
    """One session as the list (and its websocket push) shows it: its context figures (the
    main thread's) and its bill (the whole session's), from sessions_app.scope."""

    session: Session
    context: ContextFigures
    bill: BillFigures
    active_run: CompactionRun | None
    last_compaction: Mapping[str, Any] | None
    title: str = ""

    @property
    def id(self) -> uuid.UUID:
        return self.session.pk

    @property
    def percent(self) -> float:
        return self.context.percent_used

    @property
    def level(self) -> str:
        return usage_level(self.context.percent_used)

    @property
    def context_tokens(self) -> int:
        return self.context.context_tokens

    @property
    def cost(self) -> Decimal | None:
        """The known sum (None before any reported call); bill.unpriced_calls says what it
        leaves out."""
        if not self.bill.reported_events and not self.bill.calls and not self.bill.total_tokens:
            return None
        return Decimal(self.bill.cost_nano_usd) / pricing.NANO_PER_USD

    @property
    def hit_rate(self) -> float | None:
        return self.bill.cache_hit_rate

    @property
    def hit_percent(self) -> float | None:
        return None if self.hit_rate is None else round(100 * self.hit_rate, 1)

    @property
    def saved_tokens(self) -> int:
        return self.bill.saved_tokens

    @property
    def saved_usd(self) -> Decimal:
        return Decimal(self.bill.saved_nano_usd) / pricing.NANO_PER_USD

    @property
    def bar_width(self) -> float:
        return min(self.percent, 100.0)

    @property
    def gauge_dash(self) -> str:
        """stroke-dasharray of the gauge's ring (r = 52, so the circumference is 2π·52)."""
        circumference = 2 * math.pi * GAUGE_RADIUS
        filled = circumference * self.bar_width / 100
        return f"{filled:.1f} {circumference:.1f}"


def session_row(
    *,
    session: Session,
    active_run: CompactionRun | None = None,
    threads: list[Thread] | None = None,
    bill: BillFigures | None = None,
) -> SessionRow:
    """`threads`: the session's threads when the caller read them for a page of rows."""
    return SessionRow(
        session=session,
        context=scope.context_figures(session=session, threads=threads),
        bill=bill if bill is not None else scope.bill_figures(session=session, with_calls=False),
        active_run=active_run,
        last_compaction=session.last_compaction,
        title=display_title(session=session),
    )


def active_runs_by_session(session_ids: Iterable[Any]) -> dict[Any, CompactionRun]:
    runs = CompactionRun.objects.filter(
        session_id__in=list(session_ids), status__in=ACTIVE_STATUSES
    )
    return {run.session_id: run for run in runs}


@dataclass(frozen=True)
class ListFilters:
    q: str = ""
    model: str = ""
    near: bool = False
    sort: str = DEFAULT_SORT
    page: int = 1

    @classmethod
    def from_query(cls, params: Mapping[str, str]) -> ListFilters:
        sort = params.get("sort", DEFAULT_SORT) or DEFAULT_SORT
        if sort.lstrip("-") not in SORTS:
            sort = DEFAULT_SORT
        try:
            page = max(int(params.get("page", "1")), 1)
        except ValueError:
            page = 1
        return cls(
            q=params.get("q", "").strip()[:200],
            model=params.get("model", "").strip()[:200],
            near=params.get("near", "") in ("1", "on", "true"),
            sort=sort,
            page=page,
        )

    def query_string(self, **changes: Any) -> str:
        """The list URL's query for these filters with `changes` applied (for links)."""
        from urllib.parse import urlencode

        values = {
            "q": self.q,
            "model": self.model,
            "near": "1" if self.near else "",
            "sort": self.sort,
            "page": self.page,
        }
        values.update(changes)
        if values["sort"] == DEFAULT_SORT:
            values["sort"] = ""
        if values["page"] == 1:
            values["page"] = ""
        return urlencode({k: v for k, v in values.items() if v})


def _with_usage(queryset: QuerySet[Session]) -> QuerySet[Session]:
    # The context figure of sessions_app.scope in SQL, so the list can sort and filter on it
    # over every session: the main thread's last forwarded context for a session with several
    # threads, else the ledger's active context (Session.context_tokens).
    threads = Thread.objects.filter(session=OuterRef("pk"))
    thread_count = Subquery(
        threads.order_by().values("session").annotate(n=Count("id")).values("n")[:1]
    )
    main_context = Subquery(
        threads.annotate(unnamed=Case(When(key=MAIN_NAME, then=Value(0)), default=Value(1)))
        .order_by("unnamed", "-calls", "created_at", "id")
        .values("context_tokens")[:1]
    )
    context = Case(
        When(thread_count__gte=2, then=main_context),
        When(active_event_count=0, then=Value(0)),
        default=F("active_tokens") + REPLY_PRIMER,
    )
    return queryset.annotate(
        thread_count=Coalesce(thread_count, Value(0)),
        ratio_used=Cast(context, FloatField()) / Cast(F("context_limit"), FloatField()),
        compact_threshold=Coalesce(
            Cast(KT("settings__compactThreshold"), FloatField()),
            Value(SETTING_DEFAULTS["compactThreshold"]),
        ),
    )


def sessions_page(
    *, user: AbstractBaseUser | AnonymousUser, filters: ListFilters
) -> tuple[Page, list[SessionRow]]:
    queryset = _with_usage(sessions_visible_to(user=user))
    queryset = _with_first_user_text(queryset)
    if filters.q:
        text = Q(title__icontains=filters.q) | Q(model__icontains=filters.q)
        content = sessions_matching_content(text=filters.q)  # any event's text, folded too
        queryset = queryset.filter(text | content if content is not None else text)
    if filters.model:
        queryset = queryset.filter(model=filters.model)
    if filters.near:
        # "Near its limit" is the session's own compact threshold, as the usage API says.
        queryset = queryset.filter(Q(ratio_used__gte=F("compact_threshold")))
    descending = filters.sort.startswith("-")
    ordering = [("-" if descending else "") + name for name in SORTS[filters.sort.lstrip("-")]]
    queryset = queryset.order_by(*ordering, "pk")
    page = Paginator(queryset, PAGE_SIZE).get_page(filters.page)
    sessions = list(page.object_list)
    active = active_runs_by_session(s.pk for s in sessions)
    threads = threads_by_session(session_ids=[s.pk for s in sessions])
    rows = [
        session_row(session=s, active_run=active.get(s.pk), threads=threads.get(s.pk, []))
        for s in sessions
    ]
    return page, rows


def api_token_of(*, user: AbstractBaseUser | AnonymousUser) -> str | None:
    """The user's own REST/gateway token, shown to them alone on the get-started panel."""
    from rest_framework.authtoken.models import Token

    if not user.is_authenticated:
        return None
    return Token.objects.filter(user_id=user.pk).values_list("key", flat=True).first()


def models_in_use(*, user: AbstractBaseUser | AnonymousUser) -> list[str]:
    return list(
        sessions_visible_to(user=user).order_by("model").values_list("model", flat=True).distinct()
    )


# --- session page ----------------------------------------------------------------------------


@dataclass
class Timeline:
    """A window of the session page's trace: the newest TIMELINE_WINDOW events before `before`
    (or all of them with show_all), and where the next "earlier" window starts."""

    items: list[Item]
    total: int
    shown: int
    shown_all: bool
    # The first seq this window holds; None when nothing earlier is left to load.
    earlier_before: int | None = None


def timeline(*, session: Session, show_all: bool = False, before: int | None = None) -> Timeline:
    """The conversation as a trace (see trace.build_trace), newest TIMELINE_WINDOW events first
    loaded, older ones by the page's "earlier" link: the ones a compaction folded kept in place
    and grouped, not moved under their summary. The page's cost stays flat as the session
    grows; `show_all` (the citations' target) still lists everything."""
    events_qs = Event.objects.filter(session=session)
    total = session.event_count
    if before is not None:
        events_qs = events_qs.filter(seq__lt=before)
    if show_all:
        events = list(events_qs.order_by("seq"))
    else:
        events = list(reversed(events_qs.order_by("-seq")[:TIMELINE_WINDOW]))
    first_seq = events[0].seq if events else None
    earlier = (
        first_seq
        if not show_all
        and first_seq is not None
        and len(events) == TIMELINE_WINDOW
        and events_qs.filter(seq__lt=first_seq).exists()
        else None
    )
    marker_ids = {event.compacted_by_id for event in events if event.compacted_by_id} | {
        event.pk for event in events if event.type == EventType.COMPACTION
    }
    runs = list(
        CompactionRun.objects.filter(
            session=session, compaction_event_id__in=marker_ids
        ).select_related("compaction_event")
    )
    runs_by_marker = {run.compaction_event_id: run for run in runs}
    marker_seqs = {
        run.compaction_event_id: run.compaction_event.seq for run in runs if run.compaction_event
    }

    def cost_of(event: Event) -> Decimal | None:
        return _event_cost(session.model, event)

    items = build_trace(
        events,
        runs_by_marker=runs_by_marker,
        marker_seqs=marker_seqs,
        cost_of=cost_of,
        expanded_tail=EXPANDED_TAIL if before is None else 0,
    )
    return Timeline(
        items=items,
        total=total,
        shown=len(events),
        shown_all=show_all or (before is None and earlier is None),
        earlier_before=earlier,
    )


# Events after the last compaction that the chart replays one by one (older ones are drawn
# from the runs' stored before/after figures).
CHART_TAIL = 400


def _chart_event(seq: int, tokens: int, kind: str, reverted: bool, created: datetime) -> ChartEvent:
    visible = kind not in MODEL_INVISIBLE_TYPES and kind != EventType.COMPACTION and not reverted
    return ChartEvent(seq=seq, tokens=tokens, visible=visible, at=created.timestamp())


# The chart draws the latest CHART_RUNS runs (a bounded window, read through the runs'
# (session, -created_at) index like the timeline's latest events); older ones are counted.
CHART_RUNS = 150


def _each_run(completed: QuerySet[CompactionRun]) -> list[ChartCompaction]:
    # One narrow row per run (no summary text), the aggregates the chart needs.
    runs = completed.values_list(
        "compaction_event__seq",
        "compaction_event__created_at",
        "tokens_before",
        "tokens_after",
        "strategy",
        "trigger",
    )
    return [
        ChartCompaction(
            seq=seq,
            tokens_before=before or 0,
            tokens_after=after or 0,
            # A refresh run appends its CONTEXT_REFRESH right after its marker.
            covers_through=seq + 1 if trigger == "refresh" else seq,
            label=f"{strategy} · {trigger}",
            at=created.timestamp(),
        )
        for seq, created, before, after, strategy, trigger in runs
    ]


def chart_series(*, session: Session) -> Series:
    """The context-size history of the session, read from stored per-run aggregates (each
    completed run's tokens before / after at its marker; the latest CHART_RUNS of them) and
    the newest CHART_TAIL events since the last run, so drawing it costs the same at 3k
    events as at 12k (see chart.stitched_series). A short session without runs is replayed
    exactly."""
    completed = CompactionRun.objects.filter(
        session=session,
        status=RunStatus.COMPLETED,
        reverted_at__isnull=True,
        compaction_event__isnull=False,
    )
    run_count = completed.count()
    compactions = _each_run(completed.order_by("-created_at")[:CHART_RUNS])
    after = max((c.covers_through or c.seq for c in compactions), default=0)
    rows = list(
        Event.objects.filter(session=session, seq__gt=after)
        .order_by("-seq")
        .values_list("seq", "token_count", "type", "reverted", "created_at")[:CHART_TAIL]
    )
    tail = [_chart_event(*row) for row in reversed(rows)]
    if not compactions and (not tail or tail[0].seq <= 1):
        return context_series(events=tail)  # the whole (short) session, exactly
    # The active tokens before the tail's first event: today's, less what the tail added.
    tail_tokens = sum(e.tokens for e in tail if e.visible and e.seq > after)
    base = max(session.active_tokens - tail_tokens, 0)
    start = None
    if not compactions or run_count <= CHART_RUNS:
        start = Point(0, 0, session.created_at.timestamp())
    series = stitched_series(compactions=compactions, tail=tail, tail_base=base, start=start)
    return Series(points=series.points, marks=series.marks, run_count=run_count)


def call_inputs(*, session: Session) -> list[CallInput]:
    """Each reported provider call's input, cached and not, for the chart's input strip."""
    rows = (
        Event.objects.filter(session=session, prompt_tokens__isnull=False)
        .order_by("seq")
        .values_list("seq", "prompt_tokens", "cached_input_tokens")
    )
    return [CallInput(seq=seq, input_tokens=p or 0, cached_tokens=c or 0) for seq, p, c in rows]


@dataclass
class SessionView:
    """Everything the session page's partials read."""

    session: Session
    # REST /usage's document (sessions_app.scope): the main thread's context, the session's bill.
    usage: dict[str, Any]
    row: SessionRow
    runs: list[CompactionRun]
    revertible_id: uuid.UUID | None
    active_run: CompactionRun | None
    summary: RunningSummary | None
    schedule: Schedule
    strategies: tuple[str, ...] = STRATEGY_NAMES
    # What the summary costs in the context: its COMPACTION event's count (the message, as the
    # timeline and the run's before / after show it), not the bare text's.
    summary_tokens: int | None = None
    runs_total: int = 0
    # How many writers (gateway threads) the session has: figures say their scope when > 1.
    thread_count: int = 0


# Compaction history rows on the page (the API lists every run).
HISTORY_ROWS = 5


def session_view(*, session: Session, all_runs: bool = False) -> SessionView:
    """`all_runs`: every run in the history (the page's "show all"), else the latest few."""
    listed = runs_for_session(session=session).select_related("compaction_event")
    runs = list(listed if all_runs else listed[:HISTORY_ROWS])
    for run in runs:
        # Read by the history table; a plain attribute keeps the model free of view code.
        run.duration_seconds = (  # type: ignore[attr-defined]
            (run.finished_at - run.started_at).total_seconds()
            if run.started_at and run.finished_at
            else None
        )
    active = next((run for run in runs if run.status in ACTIVE_STATUSES), None)
    latest = latest_revertible_run(session=session)
    summary = RunningSummary.objects.filter(session=session).exclude(summary="").first()
    threads = session_threads(session=session)
    row = session_row(session=session, active_run=active, threads=threads)
    return SessionView(
        session=session,
        # One document for the gauge, the figures and the push (REST /usage's).
        usage=usage_for_session(session=session),
        row=row,
        runs=runs,
        revertible_id=latest.pk if latest is not None else None,
        active_run=active,
        summary=summary,
        schedule=schedule_for(session=session, context=row.context),
        thread_count=len(threads),
        runs_total=(
            len(runs)
            if all_runs or len(runs) < HISTORY_ROWS
            else runs_for_session(session=session).count()
        ),
        # What the summary costs in the context (its COMPACTION event's count), the number the
        # timeline's summary entry shows; GET /summary gives it as messageTokenCount.
        summary_tokens=summary_message_tokens(session=session) if summary is not None else None,
    )


def run_label(run: CompactionRun) -> str:
    """ "summarize · manual": strategy and trigger, no brackets to nest inside others."""
    return f"{run.strategy} · {run.trigger}"


@dataclass(frozen=True)
class Schedule:
    """When the session will compact next: the thresholds as tokens and how far away they are."""

    auto_compact: bool
    compact_ratio: float
    hard_ratio: float
    compact_at: int
    hard_at: int
    tokens_to_compact: int
    tokens_to_hard: int
    cooldown_seconds: int
    cooldown_left: int
    refresh_at: int
    tokens_to_refresh: int

    compact_percent: int
    hard_percent: int

    @property
    def gauge_ticks(self) -> list[tuple[float, float, float, float, str]]:
        """Marks across the gauge's ring (r = 52 around 60,60, starting at the top) at the
        compact threshold and the hard limit: x1, y1, x2, y2, css class."""
        ticks = []
        for ratio, css in ((self.compact_ratio, "tick-compact"), (self.hard_ratio, "tick-hard")):
            angle = 2 * math.pi * ratio - math.pi / 2
            inner, outer = GAUGE_RADIUS - 9, GAUGE_RADIUS + 8
            ticks.append(
                (
                    round(60 + inner * math.cos(angle), 1),
                    round(60 + inner * math.sin(angle), 1),
                    round(60 + outer * math.cos(angle), 1),
                    round(60 + outer * math.sin(angle), 1),
                    css,
                )
            )
        return ticks


def schedule_for(
    *, session: Session, context: ContextFigures | None = None, now: datetime | None = None
) -> Schedule:
    """When the session compacts next, from the same context figures the gauge shows (the
    main thread's; sessions_app.scope)."""
    settings = SessionSettings.of(session.settings)
    if context is None:
        context = scope.context_figures(session=session)
    cooldown = settings.cooldown_seconds
    level = context.level
    last_auto = (
        CompactionRun.objects.filter(session=session, trigger="auto")
        .order_by("-created_at")
        .values_list("created_at", flat=True)
        .first()
    )
    now = now or timezone.now()
    left = 0
    if last_auto is not None:
        left = max(int(cooldown - (now - last_auto).total_seconds()), 0)
    refresh_at = settings.refresh_threshold_tokens
    return Schedule(
        auto_compact=settings.auto_compact,
        compact_ratio=settings.compact_threshold,
        hard_ratio=settings.hard_limit_threshold,
        compact_at=level.compact_at,
        hard_at=level.hard_at,
        compact_percent=level.compact_percent,
        hard_percent=level.hard_percent,
        tokens_to_compact=level.tokens_to_compact,
        tokens_to_hard=level.tokens_to_hard,
        cooldown_seconds=cooldown,
        cooldown_left=left,
        refresh_at=refresh_at,
        tokens_to_refresh=max(refresh_at - session.cumulative_tokens, 0),
    )


def is_exact(*, session: Session) -> bool:
    return counter_is_exact(session=session)


@dataclass
class RunDetail:
    """One run's before / after: its numbers, the summary it wrote, what it folded, and the
    evidence its loss report says it dropped."""

    run: CompactionRun
    summary: str
    folded: list[Event]
    folded_total: int
    cleared_total: int
    loss: Mapping[str, Any] | None

    @property
    def dropped_by_kind(self) -> list[tuple[str, list[Mapping[str, Any]]]]:
        groups: dict[str, list[Mapping[str, Any]]] = {}
        for item in (self.loss or {}).get("dropped", []) or []:
            groups.setdefault(str(item.get("kind", "other")), []).append(item)
        return sorted(groups.items())


FOLDED_LIST_LIMIT = 500


def run_detail(*, run: CompactionRun) -> RunDetail:
    marker = run.compaction_event
    folded_qs = (
        Event.objects.filter(compacted_by=marker).order_by("seq")
        if marker is not None
        else Event.objects.none()
    )
    cleared = Event.objects.filter(cleared_by=marker).count() if marker is not None else 0
    loss = getattr(run, "loss_report", None)
    return RunDetail(
        run=run,
        summary=marker.content if marker is not None else "",
        folded=list(folded_qs[:FOLDED_LIST_LIMIT]),
        folded_total=folded_qs.count(),
        cleared_total=cleared,
        loss=loss if isinstance(loss, Mapping) and loss else None,
    )


# --- a call's page ----------------------------------------------------------------------------

# Runs of this many messages or more with the same fate fold into one expandable row.
FOLD_RUN = 6


def call_page(*, call: Any, story: dict[str, Any]) -> dict[str, Any]:
    """The call page's context: the story, its messages grouped in runs of one fate (a long
    run of kept messages folds into one row people can open)."""
    groups: list[dict[str, Any]] = []
    for message in story["request"]["messages"]:
        if groups and groups[-1]["fate"] == message["fate"]:
            groups[-1]["messages"].append(message)
        else:
            groups.append({"fate": message["fate"], "messages": [message]})
    for group in groups:
        group["folded"] = len(group["messages"]) >= FOLD_RUN
        group["tokens"] = sum(m["tokenCount"] for m in group["messages"])
        group["forwarded"] = sum(m["forwardedTokens"] or 0 for m in group["messages"])
        group["first_seq"] = group["messages"][0]["seq"]
        group["last_seq"] = group["messages"][-1]["seq"]
    return {
        "call": call,
        "story": story,
        "groups": groups,
        "billed_tokens": (call.prompt_tokens or 0) + (call.completion_tokens or 0),
    }
