"""The calls ledger: one row per gateway call (sessions_app.models.Call), written here (only
sessions_app writes the ledger; the gateway hands over what it measured) and read here for
the API and the dashboard: filtered lists, latency percentiles, error rate and totals."""

from __future__ import annotations

import datetime
import math
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models import Count, OuterRef, Q, QuerySet, Subquery, Sum

from sessions_app import pricing
from sessions_app.models import ERROR_STATUSES, Call, CallStatus, Event, Session
from sessions_app.storable import storable_text
from sessions_app.usage_bounds import bound_usage

# Percentiles are computed over at most this many of the range's most recent calls (the
# database engines share no percentile function); the totals cover the whole range.
PERCENTILE_SAMPLE = 20_000


def _bounded(text: str, size: int) -> str:
    # Stored strings hold no NUL (PostgreSQL cannot store it) and no lone surrogate (no
    # database encoding holds one): a refused model name's row was lost to them (issue 42).
    return storable_text(text)[:size]


def call_record(
    *,
    session_id: uuid.UUID,
    started_at: datetime.datetime,
    wire: str,
    status: str,
    thread: str = "",
    model_requested: str = "",
    model_served: str = "",
    http_status: int | None = None,
    error_code: str = "",
    error: str = "",
    stream: bool = False,
    ttfb_ms: int | None = None,
    total_ms: int | None = None,
    prompt_tokens: int | None = None,
    cached_input_tokens: int | None = None,
    cache_write_tokens: int | None = None,
    cache_write_1h_tokens: int | None = None,
    completion_tokens: int | None = None,
    fitted: bool = False,
    forwarded_tokens: int | None = None,
    saved_tokens: int = 0,
    attempts: Sequence[dict[str, Any]] = (),
    reply_event_id: uuid.UUID | None = None,
    usage_dropped: dict[str, str] | None = None,
) -> Call:
    """Store one gateway call. Its cost is priced here, as the session's bill prices it.

    Its usage figures go through the one bound (usage_bounds.bound_usage) the reply's events
    went through: a figure past it is dropped and named in `usage_dropped`, never a bigint
    overflow that loses the row (issue 42, row 4)."""
    if status not in CallStatus.values:
        raise ValueError(f"unknown call status {status!r}")
    figures, dropped = bound_usage(
        {
            "prompt_tokens": prompt_tokens,
            "cached_input_tokens": cached_input_tokens,
            "cache_write_tokens": cache_write_tokens,
            "cache_write_1h_tokens": cache_write_1h_tokens,
            "completion_tokens": completion_tokens,
        }
    )
    prompt_tokens = figures["prompt_tokens"]
    cached_input_tokens = figures["cached_input_tokens"]
    cache_write_tokens = figures["cache_write_tokens"]
    cache_write_1h_tokens = figures["cache_write_1h_tokens"]
    completion_tokens = figures["completion_tokens"]
    dropped = {**(usage_dropped or {}), **dropped}
    cost = None
    if prompt_tokens is not None or completion_tokens is not None:
        cost = pricing.price_call(
            model_served or model_requested,
            pricing.CallUsage(
                input_tokens=prompt_tokens or 0,
                output_tokens=completion_tokens or 0,
                cached_input_tokens=cached_input_tokens or 0,
                cache_write_tokens=cache_write_tokens or 0,
                cache_write_1h_tokens=cache_write_1h_tokens or 0,
            ),
        ).nano_usd
    # One INSERT, atomic by itself (on SQLite a transaction around it would take the write
    # lock one statement earlier).
    return Call.objects.create(
        session_id=session_id,
        started_at=started_at,
        wire=_bounded(wire, 32),
        status=status,
        thread=_bounded(thread, 200),
        model_requested=_bounded(model_requested, 200),
        model_served=_bounded(model_served, 200),
        http_status=http_status,
        error_code=_bounded(error_code, 100),
        error=_bounded(error, 500),
        stream=stream,
        ttfb_ms=ttfb_ms,
        total_ms=total_ms,
        prompt_tokens=prompt_tokens,
        cached_input_tokens=cached_input_tokens,
        cache_write_tokens=cache_write_tokens,
        completion_tokens=completion_tokens,
        cost_nano_usd=cost,
        fitted=fitted,
        forwarded_tokens=forwarded_tokens,
        saved_tokens=max(saved_tokens, 0),
        attempts=list(attempts),
        reply_event_id=reply_event_id,
        usage_dropped={str(k)[:40]: _bounded(str(v), 200) for k, v in list(dropped.items())[:10]},
    )


# --- reads ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CallFilters:
    """What a calls list is narrowed to (each None: not narrowed)."""

    since: datetime.datetime | None = None
    until: datetime.datetime | None = None
    statuses: tuple[str, ...] = ()
    model: str | None = None
    thread: str | None = None

    def apply(self, queryset: QuerySet[Call]) -> QuerySet[Call]:
        if any("\x00" in (value or "") for value in (self.model, self.thread)):
            # No stored string holds a NUL (and PostgreSQL cannot compare one): no match.
            return queryset.none()
        if self.since is not None:
            queryset = queryset.filter(started_at__gte=self.since)
        if self.until is not None:
            queryset = queryset.filter(started_at__lt=self.until)
        if self.statuses:
            queryset = queryset.filter(status__in=self.statuses)
        if self.model:
            # The model asked for or the one that served it (a failover's).
            queryset = queryset.filter(Q(model_requested=self.model) | Q(model_served=self.model))
        if self.thread:
            queryset = queryset.filter(thread=self.thread)
        return queryset


def calls_visible_to(
    *,
    user: AbstractBaseUser | AnonymousUser,
    session: Session | None = None,
    filters: CallFilters | None = None,
) -> QuerySet[Call]:
    """Calls of `session`, or of every session the user may see (staff: every user's),
    newest first."""
    if session is not None:
        queryset = Call.objects.filter(session=session)
    elif getattr(user, "is_staff", False):
        queryset = Call.objects.all()
    else:
        queryset = Call.objects.filter(session__owner_id=user.pk)
    if filters is not None:
        queryset = filters.apply(queryset)
    return with_reply_seq(queryset).order_by("-started_at", "id")


def with_reply_seq(queryset: QuerySet[Call]) -> QuerySet[Call]:
    """Each call with `reply_seq`: its reply's first event's seq (None: no reply stored)."""
    return queryset.annotate(
        reply_seq=Subquery(
            Event.objects.filter(
                pk=OuterRef("reply_event_id"), session_id=OuterRef("session_id")
            ).values("seq")[:1]
        )
    )


def _percentile(values: list[int], fraction: float) -> int | None:
    """Nearest-rank percentile of sorted `values`."""
    if not values:
        return None
    rank = max(math.ceil(fraction * len(values)), 1)
    return values[rank - 1]


def calls_summary(queryset: QuerySet[Call]) -> dict[str, Any]:
    """Totals, error rate and latency percentiles of the calls in `queryset` (a filtered list)."""
    totals = queryset.order_by().aggregate(
        calls=Count("id"),
        errors=Count("id", filter=Q(status__in=ERROR_STATUSES)),
        prompt=Sum("prompt_tokens"),
        cached=Sum("cached_input_tokens"),
        cache_write=Sum("cache_write_tokens"),
        completion=Sum("completion_tokens"),
        cost=Sum("cost_nano_usd"),
        unpriced=Count(
            "id",
            filter=Q(cost_nano_usd__isnull=True)
            & (Q(prompt_tokens__isnull=False) | Q(completion_tokens__isnull=False)),
        ),
        saved=Sum("saved_tokens"),
        fitted=Count("id", filter=Q(fitted=True)),
    )
    sample = list(
        queryset.order_by("-started_at").values_list("ttfb_ms", "total_ms", "attempts")[
            :PERCENTILE_SAMPLE
        ]
    )
    ttfb = sorted(row[0] for row in sample if row[0] is not None)
    total = sorted(row[1] for row in sample if row[1] is not None)
    calls = totals["calls"] or 0
    errors = totals["errors"] or 0
    return {
        "calls": calls,
        "errors": errors,
        "errorRate": round(100 * errors / calls, 1) if calls else None,
        # Counted on the sample: JSON length lookups differ per database engine.
        "failovers": sum(1 for row in sample if len(row[2] or []) > 1),
        "fitted": totals["fitted"] or 0,
        "promptTokens": totals["prompt"] or 0,
        "cachedInputTokens": totals["cached"] or 0,
        "cacheWriteTokens": totals["cache_write"] or 0,
        "completionTokens": totals["completion"] or 0,
        "totalTokens": (totals["prompt"] or 0) + (totals["completion"] or 0),
        "savedTokens": totals["saved"] or 0,
        "costUsd": pricing.usd(totals["cost"] or 0),
        "unpricedCalls": totals["unpriced"] or 0,
        "latencyMs": {
            "ttfb": {name: _percentile(ttfb, q) for name, q in _QUANTILES},
            "total": {name: _percentile(total, q) for name, q in _QUANTILES},
        },
        "sampled": len(sample),
    }


_QUANTILES = (("p50", 0.50), ("p90", 0.90), ("p99", 0.99))


def call_document(call: Call) -> dict[str, Any]:
    """A call as the API shows it."""
    return {
        "id": str(call.id),
        "sessionId": str(call.session_id),
        "startedAt": call.started_at.isoformat().replace("+00:00", "Z"),
        "wire": call.wire,
        "thread": call.thread,
        "modelRequested": call.model_requested,
        "modelServed": call.model_served,
        "status": call.status,
        "httpStatus": call.http_status,
        "errorCode": call.error_code,
        "error": call.error,
        "stream": call.stream,
        "ttfbMs": call.ttfb_ms,
        "totalMs": call.total_ms,
        "promptTokens": call.prompt_tokens,
        "cachedInputTokens": call.cached_input_tokens,
        "cacheWriteTokens": call.cache_write_tokens,
        "completionTokens": call.completion_tokens,
        "totalTokens": (call.prompt_tokens or 0) + (call.completion_tokens or 0)
        if call.prompt_tokens is not None or call.completion_tokens is not None
        else None,
        "costUsd": pricing.usd(call.cost_nano_usd) if call.cost_nano_usd is not None else None,
        "fitted": call.fitted,
        "forwardedTokens": call.forwarded_tokens,
        "savedTokens": call.saved_tokens,
        "failovers": call.failovers,
        "attempts": call.attempts,
        "replySeq": getattr(call, "reply_seq", None),
        "usageDropped": call.usage_dropped or {},
    }
