"""The calls ledger: one row per gateway call (sessions_app.models.Call), written here (only
sessions_app writes the ledger; the gateway hands over what it measured) and read here for
the API and the dashboard: filtered lists, latency percentiles, error rate and totals."""

from __future__ import annotations

import datetime
import math
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import transaction
from django.db.models import Count, F, OuterRef, Q, QuerySet, Subquery, Sum, Value
from django.db.models.functions import Coalesce

from sessions_app import call_rollup, pricing
from sessions_app.models import ERROR_STATUSES, Call, CallStatus, Event, Session
from sessions_app.storable import storable_text
from sessions_app.usage_bounds import bound_parts, bound_usage

# Percentiles are computed over at most this many of the range's most recent calls (the
# database engines share no percentile function); the totals cover the whole range.
PERCENTILE_SAMPLE = 20_000


def _bounded(text: str, size: int) -> str:
    # Stored strings hold no NUL (PostgreSQL cannot store it) and no lone surrogate (no
    # database encoding holds one): a refused model name's row was lost to them (issue 42).
    return storable_text(text)[:size]


# Headers the call page shows (lower case); any other is not stored. Credentials among them are
# masked whole: no part of a key is kept.
REQUEST_HEADERS = frozenset(
    {
        "accept",
        "anthropic-beta",
        "anthropic-version",
        "authorization",
        "content-length",
        "content-type",
        "openai-beta",
        "openai-organization",
        "openai-project",
        "traceparent",
        "user-agent",
        "x-api-key",
        "x-goog-api-client",
        "x-goog-api-key",
        "x-ledger-context-limit",
        "x-ledger-fallback-models",
        "x-ledger-fit",
        "x-ledger-key",
        "x-ledger-session",
        "x-ledger-thread",
        "x-stainless-arch",
        "x-stainless-lang",
        "x-stainless-os",
        "x-stainless-package-version",
        "x-stainless-retry-count",
        "x-stainless-runtime",
        "x-stainless-runtime-version",
    }
)
RESPONSE_HEADERS_PREFIXES = ("anthropic-ratelimit-", "x-ratelimit-", "x-ledger-")
RESPONSE_HEADERS = frozenset(
    {
        "content-type",
        "openai-processing-ms",
        "openai-version",
        "request-id",
        "retry-after",
        "x-request-id",
    }
)
SECRET_HEADERS = frozenset(
    {
        "api-key",
        "authorization",
        "cookie",
        "proxy-authorization",
        "set-cookie",
        "x-api-key",
        "x-goog-api-key",
        "x-ledger-key",
    }
)
MASK = "••••••"
# Authorization schemes kept before the mask (the scheme names no secret).
_SCHEMES = frozenset({"bearer", "basic", "token"})
MAX_HEADER_VALUE = 200
MAX_HEADERS = 60


def masked_headers(headers: Mapping[str, str], allowed: frozenset[str]) -> dict[str, str]:
    """The allowed `headers` (lower-cased names, in order), each credential masked: an
    `Authorization` keeps its scheme ("Bearer ••••••"), any other secret is the mask alone."""
    out: dict[str, str] = {}
    for name, value in headers.items():
        key = str(name).lower()
        if key not in allowed and not (
            allowed is RESPONSE_HEADERS and key.startswith(RESPONSE_HEADERS_PREFIXES)
        ):
            continue
        text = str(value)
        if key in SECRET_HEADERS:
            scheme = text.strip().split(" ", 1)[0]
            text = f"{scheme} {MASK}" if scheme.lower() in _SCHEMES and " " in text else MASK
        out[key] = _bounded(text, MAX_HEADER_VALUE)
        if len(out) >= MAX_HEADERS:
            break
    return out


def call_record(
    *,
    session_id: uuid.UUID | None,
    owner_id: Any,
    started_at: datetime.datetime,
    session_key: str = "",
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
    reasoning_tokens: int | None = None,
    usage_status: str = "",
    priced_apart: Sequence[pricing.CallUsage] = (),
    cache: dict[str, Any] | None = None,
    prefix: dict[str, Any] | None = None,
    fitted: bool = False,
    forwarded_tokens: int | None = None,
    saved_tokens: int = 0,
    attempts: Sequence[dict[str, Any]] = (),
    reply_event_id: uuid.UUID | None = None,
    gateway_ms: int | None = None,
    request_headers: Mapping[str, str] | None = None,
    response_headers: Mapping[str, str] | None = None,
    fit: dict[str, Any] | None = None,
    request_map: dict[str, Any] | None = None,
    usage_dropped: dict[str, str] | None = None,
) -> Call:
    """Store one gateway call (`session_id` None: refused before any session existed; its
    owner still sees it). Its cost is priced here, as the session's bill prices it, and split
    by token kind; its headers are kept masked (masked_headers), never as they came.
    `usage_status` "absent": the provider sent no usage and the figures are the gateway's own
    count (the cost is then marked as an estimate). `cache`: the call's cache outcome document
    (compaction_app.gateway.cache_outcome), `prefix` the fingerprint of what it forwarded,
    which the next call of its thread is compared with.

    Its usage figures (reasoning and the parts priced apart included) go through the one bound
    (usage_bounds) the reply's events went through: a figure past it is dropped and named in
    `usage_dropped`, never a bigint overflow that loses the row (issue 42, row 4)."""
    if status not in CallStatus.values:
        raise ValueError(f"unknown call status {status!r}")
    figures, dropped = bound_usage(
        {
            "prompt_tokens": prompt_tokens,
            "cached_input_tokens": cached_input_tokens,
            "cache_write_tokens": cache_write_tokens,
            "cache_write_1h_tokens": cache_write_1h_tokens,
            "completion_tokens": completion_tokens,
            "reasoning_tokens": reasoning_tokens,
        }
    )
    prompt_tokens = figures["prompt_tokens"]
    cached_input_tokens = figures["cached_input_tokens"]
    cache_write_tokens = figures["cache_write_tokens"]
    cache_write_1h_tokens = figures["cache_write_1h_tokens"]
    completion_tokens = figures["completion_tokens"]
    reasoning_tokens = figures["reasoning_tokens"]
    _, parts_dropped = bound_parts(figures, [_neutral(part) for part in priced_apart])
    if parts_dropped:
        priced_apart = ()
    dropped = {**(usage_dropped or {}), **dropped, **parts_dropped}
    cost = None
    kinds: dict[str, Any] = {}
    if prompt_tokens is not None or completion_tokens is not None:
        breakdown = pricing.price_breakdown(
            model_served or model_requested,
            pricing.CallUsage(
                input_tokens=prompt_tokens or 0,
                output_tokens=completion_tokens or 0,
                cached_input_tokens=cached_input_tokens or 0,
                cache_write_tokens=cache_write_tokens or 0,
                cache_write_1h_tokens=cache_write_1h_tokens or 0,
                reasoning_tokens=reasoning_tokens or 0,
            ),
            priced_apart,
        )
        cost = breakdown.nano_usd
        if cost is not None:
            kinds = breakdown.document()
        usage_status = usage_status or "reported"
    fields: dict[str, Any] = dict(
        session_id=session_id,
        owner_id=owner_id,
        session_key=_bounded(session_key, 200),
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
        cache_write_1h_tokens=cache_write_1h_tokens,
        reasoning_tokens=reasoning_tokens,
        usage_status=usage_status,
        cost_nano_usd=cost,
        cost_estimated=usage_status == "absent" and cost is not None,
        cost_by_kind=kinds,
        cache_outcome=str((cache or {}).get("outcome") or ""),
        cache_reason=str((cache or {}).get("reason") or "")[:32],
        cache=cache,
        prefix=prefix,
        fitted=fitted,
        forwarded_tokens=forwarded_tokens,
        saved_tokens=max(saved_tokens, 0),
        attempts=list(attempts),
        reply_event_id=reply_event_id,
        gateway_ms=gateway_ms,
        headers={
            "request": masked_headers(request_headers or {}, REQUEST_HEADERS),
            "response": masked_headers(response_headers or {}, RESPONSE_HEADERS),
        },
        fit=fit or {},
        request_map=request_map or {},
        usage_dropped={str(k)[:40]: _bounded(str(v), 200) for k, v in list(dropped.items())[:10]},
    )
    if session_id is None:
        # No session to count it in: one INSERT, atomic by itself.
        call = Call.objects.create(**fields)
    else:
        # The row and its session's call counters together (sessions_app.scope reads them,
        # so a usage push costs no query): off the call's path, after its response.
        counter = "failed_calls" if status in ERROR_STATUSES else "answered_calls"
        with transaction.atomic():
            call = Call.objects.create(**fields)
            Session.objects.filter(pk=session_id).update(**{counter: F(counter) + 1})
    # A call saved after its 15-minute window was rolled up (a long stream): that window is
    # computed again on its next read.
    call_rollup.invalidate_late(started_at=started_at)
    return call


def _neutral(usage: pricing.CallUsage) -> dict[str, int | None]:
    """A part priced apart in the neutral figures usage_bounds reads."""
    return {
        "prompt_tokens": usage.input_tokens,
        "completion_tokens": usage.output_tokens,
        "cached_input_tokens": usage.cached_input_tokens,
        "cache_write_tokens": usage.cache_write_tokens,
        "cache_write_1h_tokens": usage.cache_write_1h_tokens,
        "reasoning_tokens": usage.reasoning_tokens,
    }


def calls_attach(*, owner_id: Any, session_key: str, session_id: uuid.UUID) -> int:
    """The owner's session-less calls made under `session_key` (refused before the session
    existed) join the session that key has now created; how many."""
    if not session_key:
        return 0
    waiting = Call.objects.filter(
        owner_id=owner_id, session__isnull=True, session_key=session_key[:200]
    )
    counts = waiting.aggregate(
        calls=Count("id"), failed=Count("id", filter=Q(status__in=ERROR_STATUSES))
    )
    moved = waiting.update(session_id=session_id)
    if moved:
        failed = counts["failed"] or 0
        Session.objects.filter(pk=session_id).update(
            answered_calls=F("answered_calls") + max((counts["calls"] or 0) - failed, 0),
            failed_calls=F("failed_calls") + failed,
        )
    return moved


# --- reads ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Prefix:
    """A stored call's prefix (Call.prefix) and where it belongs."""

    call_id: uuid.UUID
    thread: str
    started_at: datetime.datetime
    fingerprint: dict[str, Any]


def previous_prefix(
    *, session_id: uuid.UUID, thread: str, before: datetime.datetime
) -> Prefix | None:
    """The latest call of `thread` before `before` whose prefix was kept (the provider
    answered it); with `thread` "" the session's latest in any thread."""
    queryset = Call.objects.filter(
        session_id=session_id, started_at__lt=before, prefix__isnull=False
    )
    if thread:
        queryset = queryset.filter(thread=thread)
    found = (
        queryset.order_by("-started_at").values_list("id", "thread", "started_at", "prefix").first()
    )
    if found is None or found[3] is None:
        return None
    return Prefix(call_id=found[0], thread=found[1], started_at=found[2], fingerprint=found[3])


@dataclass(frozen=True)
class CallFilters:
    """What a calls list is narrowed to (each None: not narrowed)."""

    since: datetime.datetime | None = None
    until: datetime.datetime | None = None
    statuses: tuple[str, ...] = ()
    model: str | None = None
    thread: str | None = None
    # Text in the model (asked for or served), the session's title or the error message.
    search: str | None = None
    session_id: Any = None
    # Staff: one user's calls.
    user_id: int | None = None

    def apply(self, queryset: QuerySet[Call]) -> QuerySet[Call]:
        if any("\x00" in (value or "") for value in (self.model, self.thread, self.search)):
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
        if self.search:
            text = self.search
            queryset = queryset.filter(
                Q(model_requested__icontains=text)
                | Q(model_served__icontains=text)
                | Q(session__title__icontains=text)
                | Q(error__icontains=text)
                | Q(error_code__icontains=text)
            )
        if self.session_id is not None:
            queryset = queryset.filter(session_id=self.session_id)
        if self.user_id is not None:
            queryset = queryset.filter(owner_id=self.user_id)
        return queryset


# The calls tables' sort keys (`sort=key` ascending, `sort=-key` descending) and the columns
# they order by; ties go newest first, then by id (a stable page order).
SORTS: dict[str, tuple[str, ...]] = {
    "started": ("started_at",),
    "session": ("session__title",),
    "thread": ("thread",),
    "model": ("model_requested", "model_served"),
    "status": ("status", "http_status"),
    "ttfb": ("ttfb_ms",),
    "total": ("total_ms",),
    "gateway": ("gateway_ms",),
    "tokens": ("total_tokens",),
    "prompt": ("prompt_tokens",),
    "completion": ("completion_tokens",),
    "cost": ("cost_nano_usd",),
    "cache": ("cache_outcome", "cache_reason"),
    "fitted": ("fitted", "saved_tokens"),
    "saved": ("saved_tokens",),
}


def ordered(queryset: QuerySet[Call], sort: str | None) -> QuerySet[Call]:
    """`queryset` in the order `sort` names (default: newest first); None sorts last."""
    key = (sort or "-started").strip()
    descending = key.startswith("-")
    columns = SORTS.get(key.lstrip("-"))
    if columns is None:
        raise ValueError(f"sort must be one of {', '.join(SORTS)} (a leading - reverses)")
    if "total_tokens" in columns:
        queryset = queryset.annotate(
            total_tokens=Coalesce("prompt_tokens", Value(0))
            + Coalesce("completion_tokens", Value(0))
        )
    order = [
        (F(c).desc(nulls_last=True) if descending else F(c).asc(nulls_last=True)) for c in columns
    ]
    return queryset.order_by(*order, "-started_at", "id")


def calls_visible_to(
    *,
    user: AbstractBaseUser | AnonymousUser,
    session: Session | None = None,
    filters: CallFilters | None = None,
) -> QuerySet[Call]:
    """Calls of `session`, or every call the user may see (their own, session-less refusals
    included; staff: every user's), newest first."""
    if session is not None:
        queryset = Call.objects.filter(session=session)
    elif getattr(user, "is_staff", False):
        queryset = Call.objects.all()
    else:
        queryset = Call.objects.filter(owner_id=user.pk)
    if filters is not None:
        queryset = filters.apply(queryset)
    # The prefix is the cache outcome's working data, not the call's story.
    return with_reply_seq(queryset.defer("prefix")).order_by("-started_at", "id")


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
        # None: refused before any session existed (sessionKey is what the client sent).
        "sessionId": str(call.session_id) if call.session_id else None,
        "sessionKey": call.session_key,
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
        "cacheWrite1hTokens": call.cache_write_1h_tokens,
        "completionTokens": call.completion_tokens,
        "reasoningTokens": call.reasoning_tokens,
        "totalTokens": (call.prompt_tokens or 0) + (call.completion_tokens or 0)
        if call.prompt_tokens is not None or call.completion_tokens is not None
        else None,
        "usage": call.usage_status or None,
        "costUsd": pricing.usd(call.cost_nano_usd) if call.cost_nano_usd is not None else None,
        "costEstimated": call.cost_estimated,
        "costByKind": call.cost_by_kind or None,
        "cache": call.cache,
        "fitted": call.fitted,
        "forwardedTokens": call.forwarded_tokens,
        "savedTokens": call.saved_tokens,
        "failovers": call.failovers,
        "attempts": call.attempts,
        "replySeq": getattr(call, "reply_seq", None),
        "usageDropped": call.usage_dropped or {},
    }


# --- export ---------------------------------------------------------------------------------------

CSV_COLUMNS = (
    "id",
    "sessionId",
    "startedAt",
    "wire",
    "thread",
    "modelRequested",
    "modelServed",
    "status",
    "httpStatus",
    "errorCode",
    "error",
    "stream",
    "gatewayMs",
    "ttfbMs",
    "totalMs",
    "promptTokens",
    "cachedInputTokens",
    "cacheWriteTokens",
    "completionTokens",
    "totalTokens",
    "costUsd",
    "fitted",
    "forwardedTokens",
    "savedTokens",
    "failovers",
    "replySeq",
    "costEstimated",
    "cacheOutcome",
    "cacheReason",
)


def export_rows(queryset: QuerySet[Call], *, chunk: int = 2000) -> Iterator[dict[str, Any]]:
    """Every call of `queryset` as the API shows it (plus gatewayMs), read in chunks: an
    export of a million calls holds one chunk at a time."""
    for call in queryset.iterator(chunk_size=chunk):
        document = call_document(call)
        document["gatewayMs"] = call.gateway_ms
        # The cache outcome flattened for a spreadsheet (the whole document is in `cache`).
        document["cacheOutcome"] = call.cache_outcome or None
        document["cacheReason"] = call.cache_reason or None
        yield document


def _csv_cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        # A spreadsheet would run it as a formula: kept as text.
        return "'" + value
    return value


def csv_lines(queryset: QuerySet[Call]) -> Iterator[str]:
    """The calls as CSV text, a header line first, one line per call."""
    import csv
    import io

    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(CSV_COLUMNS)
    yield buffer.getvalue()
    for document in export_rows(queryset):
        buffer.seek(0)
        buffer.truncate()
        writer.writerow([_csv_cell(document.get(name)) for name in CSV_COLUMNS])
        yield buffer.getvalue()


def ndjson_lines(queryset: QuerySet[Call]) -> Iterator[str]:
    import json

    for document in export_rows(queryset):
        yield json.dumps(document, ensure_ascii=False) + "\n"
