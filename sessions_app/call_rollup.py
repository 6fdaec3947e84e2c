"""The calls ledger rolled up: per 15-minute window (by a call's start), per session, model,
status, wire and stream, the counts, tokens by kind, cost and latency histograms. The usage
pages and /metrics read these rows instead of every call.

Windows are rolled up on read, once closed: a window is closed `GRACE` after its end (a call
is saved right after its answer ends), and its rows are stored with a marker
(CallRollupBucket) written first in the same transaction. Open windows, and closed ones not
rolled up yet, are computed from the calls themselves. A call saved after its window closed
(a stream longer than the grace) deletes the window's marker, which waits for a transaction
storing it, so that window is computed again: the rows always equal the calls.

15 minutes, because every time zone's offset is a multiple of it: hours and days in the
viewer's zone are whole sets of windows. Latency percentiles come from histograms with ten
edges a decade (a value's edge is at most a third above it); the calls list's own
percentiles are exact.
"""

from __future__ import annotations

import bisect
import datetime
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from sessions_app.models import Call, CallRollup, CallRollupBucket

WINDOW = datetime.timedelta(minutes=15)
GRACE = datetime.timedelta(minutes=2)
# Milliseconds: 1, 1.25, 1.5, 2, 2.5, 3, 4, 5, 6, 8 × 10^k, up to 800 s; past the last: +Inf.
_STEPS = (1, 1.25, 1.5, 2, 2.5, 3, 4, 5, 6, 8)
EDGES_MS: tuple[float, ...] = tuple(step * 10**k for k in range(6) for step in _STEPS)
LATENCIES = ("total", "ttfb", "gateway")
FIGURES = (
    "calls",
    "prompt_tokens",
    "cached_input_tokens",
    "cache_write_tokens",
    "completion_tokens",
    "cost_nano_usd",
    "unpriced_calls",
    "fitted",
    "saved_tokens",
)
_EPOCH = datetime.datetime(2000, 1, 1, tzinfo=datetime.UTC)


def window_of(moment: datetime.datetime) -> datetime.datetime:
    """The start of the 15-minute window `moment` falls in (UTC)."""
    moment = moment.astimezone(datetime.UTC)
    return moment - ((moment - _EPOCH) % WINDOW)


def edge_index(ms: int) -> int:
    """The histogram bucket of `ms`: the first edge at or above it (len(EDGES_MS): +Inf)."""
    return bisect.bisect_left(EDGES_MS, ms)


@dataclass
class Latency:
    sum: int = 0
    count: int = 0
    h: dict[int, int] = field(default_factory=dict)

    def add(self, ms: int | None) -> None:
        if ms is None:
            return
        self.sum += ms
        self.count += 1
        index = edge_index(ms)
        self.h[index] = self.h.get(index, 0) + 1

    def merge(self, other: Latency) -> None:
        self.sum += other.sum
        self.count += other.count
        for index, n in other.h.items():
            self.h[index] = self.h.get(index, 0) + n

    def quantile(self, q: float) -> int | None:
        """The q-quantile, interpolated inside its bucket (as Prometheus' histogram_quantile
        does); None with no values."""
        if not self.count:
            return None
        rank = q * self.count
        seen = 0
        for index in sorted(self.h):
            n = self.h[index]
            if seen + n >= rank:
                upper = EDGES_MS[index] if index < len(EDGES_MS) else EDGES_MS[-1]
                lower = EDGES_MS[index - 1] if index > 0 else 0.0
                if index >= len(EDGES_MS):
                    return int(upper)
                return int(round(lower + (upper - lower) * ((rank - seen) / n)))
            seen += n
        return int(EDGES_MS[-1])

    def document(self) -> dict[str, Any]:
        return {"sum": self.sum, "count": self.count, "h": {str(k): v for k, v in self.h.items()}}

    @classmethod
    def of(cls, data: dict[str, Any] | None) -> Latency:
        if not data:
            return cls()
        return cls(
            sum=int(data.get("sum") or 0),
            count=int(data.get("count") or 0),
            h={int(k): int(v) for k, v in (data.get("h") or {}).items()},
        )


@dataclass
class Row:
    """One rollup row (stored or computed from calls)."""

    bucket: datetime.datetime
    session_id: Any
    owner_id: int | None
    model: str
    status: str
    wire: str
    stream: bool
    calls: int = 0
    prompt_tokens: int = 0
    cached_input_tokens: int = 0
    cache_write_tokens: int = 0
    completion_tokens: int = 0
    cost_nano_usd: int = 0
    unpriced_calls: int = 0
    fitted: int = 0
    saved_tokens: int = 0
    latency: dict[str, Latency] = field(default_factory=dict)

    def lat(self, name: str) -> Latency:
        found = self.latency.get(name)
        if found is None:
            found = self.latency[name] = Latency()
        return found


# The columns a call is rolled up from (read with values_list: no model instances).
_CALL_COLUMNS = (
    "started_at",
    "session_id",
    "owner_id",
    "model_served",
    "model_requested",
    "status",
    "wire",
    "stream",
    "prompt_tokens",
    "cached_input_tokens",
    "cache_write_tokens",
    "completion_tokens",
    "cost_nano_usd",
    "fitted",
    "saved_tokens",
    "total_ms",
    "ttfb_ms",
    "gateway_ms",
)


def _rows_from_calls(
    since: datetime.datetime, until: datetime.datetime, *, owner_id: int | None = None
) -> dict[tuple[Any, ...], Row]:
    calls = Call.objects.filter(started_at__gte=since, started_at__lt=until)
    if owner_id is not None:
        calls = calls.filter(owner_id=owner_id)
    rows: dict[tuple[Any, ...], Row] = {}
    for (
        started_at,
        session_id,
        owner,
        served,
        requested,
        status,
        wire,
        stream,
        prompt,
        cached,
        write,
        completion,
        cost,
        fitted,
        saved,
        total_ms,
        ttfb_ms,
        gateway_ms,
    ) in calls.order_by().values_list(*_CALL_COLUMNS).iterator(chunk_size=5000):
        model = served or requested
        key = (window_of(started_at), session_id, owner, model, status, wire, stream)
        row = rows.get(key)
        if row is None:
            row = rows[key] = Row(*key)
        row.calls += 1
        row.prompt_tokens += prompt or 0
        row.cached_input_tokens += cached or 0
        row.cache_write_tokens += write or 0
        row.completion_tokens += completion or 0
        row.cost_nano_usd += cost or 0
        if cost is None and (prompt is not None or completion is not None):
            row.unpriced_calls += 1
        row.fitted += 1 if fitted else 0
        row.saved_tokens += saved or 0
        row.lat("total").add(total_ms)
        row.lat("ttfb").add(ttfb_ms)
        row.lat("gateway").add(gateway_ms)
    return rows


def _row_model(start: datetime.datetime, row: Row) -> CallRollup:
    return CallRollup(
        bucket_id=row.bucket,
        session_id=row.session_id,
        owner_id=row.owner_id,
        model=row.model[:200],
        status=row.status,
        wire=row.wire,
        stream=row.stream,
        latency={name: lat.document() for name, lat in row.latency.items()},
        **{name: getattr(row, name) for name in FIGURES},
    )


# Windows rolled up in one transaction (one query over their calls).
STORE_BATCH = 96


def _store(windows: list[datetime.datetime]) -> None:
    """Roll up the closed `windows` (each once: a marker another process stored first wins),
    a span of consecutive ones per transaction."""
    batches: list[list[datetime.datetime]] = []
    for first, last in _spans(sorted(windows)):
        span = list(_windows(first, last + WINDOW))
        batches += [span[i : i + STORE_BATCH] for i in range(0, len(span), STORE_BATCH)]
    for batch in batches:
        try:
            _store_batch(batch)
        except IntegrityError:
            # Some were rolled up meanwhile by another reader: the rest one by one.
            for window in batch:
                try:
                    _store_batch([window])
                except IntegrityError:
                    continue


def _store_batch(batch: list[datetime.datetime]) -> None:
    with transaction.atomic():
        # The markers first: a late call's invalidation waits for this transaction.
        CallRollupBucket.objects.bulk_create([CallRollupBucket(bucket=w) for w in batch])
        rows = _rows_from_calls(batch[0], batch[-1] + WINDOW)
        CallRollup.objects.bulk_create(
            [_row_model(row.bucket, row) for row in rows.values()], batch_size=1000
        )


def invalidate_late(*, started_at: datetime.datetime) -> None:
    """After a call is stored: if its window may be rolled up already, have it computed
    again (one statement, only for calls that ended past their window's grace)."""
    start = window_of(started_at)
    if timezone.now() >= start + WINDOW + GRACE:
        CallRollupBucket.objects.filter(bucket=start).delete()


# Closed windows rolled up per read at most (the rest are computed from the calls this time,
# and stored by later reads or `manage.py rollup_calls`): a first read of a long range over a
# large ledger stays bounded.
STORE_PER_READ = 3000


def rows(
    *,
    since: datetime.datetime,
    until: datetime.datetime,
    owner_id: int | None = None,
    now: datetime.datetime | None = None,
    store: bool = True,
) -> Iterator[Row]:
    """Every rollup row of the windows from `since`'s to the one before `until` (aligned to
    windows by the caller), of `owner_id`'s calls when given: stored rows for rolled-up
    windows, rows computed from the calls for the others (closed ones are stored first, up
    to STORE_PER_READ)."""
    now = now or timezone.now()
    since, until = window_of(since), window_of(until - datetime.timedelta(microseconds=1)) + WINDOW
    # Closed windows: those that ended at least GRACE ago.
    closed_until = since
    edge = window_of(now - GRACE)
    if edge > since:
        closed_until = min(until, edge)
    rolled = set(
        CallRollupBucket.objects.filter(bucket__gte=since, bucket__lt=closed_until).values_list(
            "bucket", flat=True
        )
    )
    missing: list[datetime.datetime] = []
    cursor = since
    while cursor < closed_until:
        if cursor not in rolled:
            missing.append(cursor)
        cursor += WINDOW
    if store and missing:
        _store(missing[:STORE_PER_READ])
        rolled = set(
            CallRollupBucket.objects.filter(bucket__gte=since, bucket__lt=closed_until).values_list(
                "bucket", flat=True
            )
        )
    stored = CallRollup.objects.filter(bucket_id__gte=since, bucket_id__lt=closed_until)
    if owner_id is not None:
        stored = stored.filter(owner_id=owner_id)
    for values in stored.values_list(
        "bucket_id",
        "session_id",
        "owner_id",
        "model",
        "status",
        "wire",
        "stream",
        *FIGURES,
        "latency",
    ).iterator(chunk_size=5000):
        row = Row(*values[:7])
        for name, value in zip(FIGURES, values[7:-1], strict=True):
            setattr(row, name, value)
        row.latency = {name: Latency.of(data) for name, data in (values[-1] or {}).items()}
        yield row
    # Everything not rolled up, computed from the calls: in spans of consecutive windows.
    for first, last in _spans([w for w in _windows(since, until) if w not in rolled]):
        yield from _rows_from_calls(first, last + WINDOW, owner_id=owner_id).values()


def _windows(since: datetime.datetime, until: datetime.datetime) -> Iterable[datetime.datetime]:
    cursor = since
    while cursor < until:
        yield cursor
        cursor += WINDOW


def _spans(windows: list[datetime.datetime]) -> list[tuple[datetime.datetime, datetime.datetime]]:
    spans: list[tuple[datetime.datetime, datetime.datetime]] = []
    for window in windows:
        if spans and spans[-1][1] + WINDOW == window:
            spans[-1] = (spans[-1][0], window)
        else:
            spans.append((window, window))
    return spans


def roll_up(*, since: datetime.datetime, until: datetime.datetime) -> int:
    """Store every closed window from `since` to `until` not rolled up yet (the management
    command); how many were stored."""
    now = timezone.now()
    edge = min(window_of(until), window_of(now - GRACE))
    start = window_of(since)
    if edge <= start:
        return 0
    rolled = set(
        CallRollupBucket.objects.filter(bucket__gte=start, bucket__lt=edge).values_list(
            "bucket", flat=True
        )
    )
    missing = [w for w in _windows(start, edge) if w not in rolled]
    _store(missing)
    return len(missing)
