"""The calls ledger rolled up: per 15-minute window (by a call's start), per session, model,
status, wire and stream, the counts, tokens by kind, cost and latency histograms. The usage
pages and /metrics read these rows instead of every call.

Windows are rolled up on read, once closed: a window is closed `GRACE` after its end (a call
is saved right after its answer ends), and its rows are stored with a marker
(CallRollupBucket) written first in the same transaction. Open windows, and closed ones not
rolled up yet, are computed from the calls themselves. A call saved after its window closed
(a stream longer than the grace) deletes the window's marker, so that window is computed
again: the rows always equal the calls.

Two coarser levels sit beside the windows, filled in the same pass that stores them: per
hour and per day (UTC), per owner, model and status (sessions, wires and streams summed;
CallRollupSpan marks an hour or a day stored, CallRollupCoarse holds its rows). An hour is
built from its four windows' rows once all four are stored, a day from its 24 hours'. A
usage read that is not per session covers each of its periods with the largest stored units
that fit in it (days, then hours, then windows), so 30 days per day read about 30 days'
rows, not 2,880 windows' (`rows_for_periods`). The figures are the same: sums of sums, and
histograms merged bucket by bucket.

Per series (wire, model, status, stream), CallSeriesTotal holds every stored window's rows
summed: added to in the transaction that stores a window, taken from in the one that drops
it for a late call. /metrics reads those rows and the calls of the windows not stored, in
one snapshot (`series_rows`).

Across processes (two ASGI processes and a worker on PostgreSQL): every transaction that
stores windows, builds hours or days, or drops a window for a late call first takes the
advisory locks of the hours it touches (sql.rollup_locks, ascending), then reads what is
stored; a marker's unique key makes a second builder of the same unit fail and skip. So a
late call's invalidation waits for a builder that read the calls before it was saved, and a
builder that comes after it sees the call.

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
from django.db.models import Count, Max
from django.utils import timezone

from sessions_app import sql
from sessions_app.models import (
    Call,
    CallRollup,
    CallRollupBucket,
    CallRollupCoarse,
    CallRollupSpan,
    CallSeriesTotal,
    RollupLevel,
)

WINDOW = datetime.timedelta(minutes=15)
HOUR = datetime.timedelta(hours=1)
DAY = datetime.timedelta(days=1)
LEVELS: dict[str, datetime.timedelta] = {RollupLevel.HOUR: HOUR, RollupLevel.DAY: DAY}
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


def unit_of(moment: datetime.datetime, size: datetime.timedelta) -> datetime.datetime:
    """The start of the hour or day (UTC; `size`) `moment` falls in."""
    moment = moment.astimezone(datetime.UTC)
    return moment - ((moment - _EPOCH) % size)


def _hour_key(moment: datetime.datetime) -> int:
    """An hour's number (the second key of its advisory lock)."""
    return int((moment - _EPOCH) // HOUR)


def _lock(since: datetime.datetime, until: datetime.datetime) -> None:
    """Lock the hours from `since`'s to `until`'s (exclusive) for this transaction."""
    first = _hour_key(since)
    last = _hour_key(until - datetime.timedelta(microseconds=1))
    sql.rollup_locks(list(range(first, last + 1)))


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

    def merge(self, other: Latency, sign: int = 1) -> None:
        self.sum += sign * other.sum
        self.count += sign * other.count
        for index, n in other.h.items():
            total = self.h.get(index, 0) + sign * n
            if total:
                self.h[index] = total
            else:
                self.h.pop(index, None)

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

    def add(self, other: Row, sign: int = 1) -> None:
        """Add (or, `sign` -1, take away) another row's figures and histograms."""
        for name in FIGURES:
            setattr(self, name, getattr(self, name) + sign * getattr(other, name))
        for name, latency in other.latency.items():
            self.lat(name).merge(latency, sign)

    def latency_document(self) -> dict[str, Any]:
        return {name: lat.document() for name, lat in self.latency.items() if lat.count}


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


def _row_model(row: Row) -> CallRollup:
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


_ROW_COLUMNS = ("session_id", "owner_id", "model", "status", "wire", "stream")


def _stored_row(bucket: datetime.datetime, values: tuple[Any, ...]) -> Row:
    """A Row from a stored window row's values: _ROW_COLUMNS, FIGURES, latency."""
    row = Row(bucket, *values[:6])
    for name, value in zip(FIGURES, values[6:-1], strict=True):
        setattr(row, name, value)
    row.latency = {name: Latency.of(data) for name, data in (values[-1] or {}).items()}
    return row


# Windows rolled up in one transaction (one query over their calls).
STORE_BATCH = 96


def _store(windows: list[datetime.datetime]) -> None:
    """Roll up the closed `windows` (each once: a marker another process stored first wins),
    a span of consecutive ones per transaction; then the hours and days they complete."""
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
    if windows:
        _store_coarse(min(windows), max(windows) + WINDOW)


def _store_batch(batch: list[datetime.datetime]) -> None:
    with transaction.atomic():
        _lock(batch[0], batch[-1] + WINDOW)
        # The markers first (a second builder of one of them fails here).
        CallRollupBucket.objects.bulk_create([CallRollupBucket(bucket=w) for w in batch])
        rows = _rows_from_calls(batch[0], batch[-1] + WINDOW)
        CallRollup.objects.bulk_create([_row_model(row) for row in rows.values()], batch_size=1000)
        _add_to_totals(rows.values(), 1)


def _series_key(row: Row) -> tuple[str, str, str, bool]:
    return (row.wire, row.model[:200], row.status, bool(row.stream))


def _add_to_totals(rows: Iterable[Row], sign: int) -> None:
    """Add the rows of windows just stored (sign 1) or take those of a window dropped (-1)
    to the per-series totals, inside the caller's transaction (rows locked in id order)."""
    delta: dict[tuple[str, str, str, bool], Row] = {}
    for row in rows:
        key = _series_key(row)
        found = delta.get(key)
        if found is None:
            found = delta[key] = Row(_EPOCH, None, None, key[1], key[2], key[0], key[3])
        found.add(row)
    if not delta:
        return
    CallSeriesTotal.objects.bulk_create(
        [
            CallSeriesTotal(wire=wire, model=model, status=status, stream=stream)
            for wire, model, status, stream in sorted(delta)
        ],
        ignore_conflicts=True,
    )
    totals = (
        CallSeriesTotal.objects.select_for_update()
        .filter(model__in={key[1] for key in delta})
        .order_by("id")
    )
    changed = []
    for total in totals:
        key = (total.wire, total.model, total.status, total.stream)
        if key not in delta:
            continue
        current = Row(_EPOCH, None, None, total.model, total.status, total.wire, total.stream)
        for name in FIGURES:
            setattr(current, name, getattr(total, name))
        current.latency = {name: Latency.of(data) for name, data in total.latency.items()}
        current.add(delta[key], sign)
        for name in FIGURES:
            setattr(total, name, getattr(current, name))
        total.latency = current.latency_document()
        changed.append(total)
    CallSeriesTotal.objects.bulk_update(changed, [*FIGURES, "latency"])


# --- the coarse levels: hours and days (UTC) --------------------------------------------------

_COARSE_COLUMNS = ("owner_id", "model", "status")
# The histograms the hours and days keep (usage over time's p50 and p99).
COARSE_LATENCIES = ("total",)
# Hours (or days) built in one transaction.
COARSE_BATCH = 24


def _store_coarse(since: datetime.datetime, until: datetime.datetime) -> None:
    """Build every hour, then every day, inside [since, until) whose parts are all stored and
    that is not stored yet (hours or days another process builds meanwhile are skipped)."""
    for level, size in ((RollupLevel.HOUR, HOUR), (RollupLevel.DAY, DAY)):
        start = unit_of(since, size)
        if start < since:
            start += size
        units = [u for u in _units(start, until, size) if u + size <= until]
        if not units:
            continue
        stored = set(
            CallRollupSpan.objects.filter(
                level=level, start__gte=units[0], start__lte=units[-1]
            ).values_list("start", flat=True)
        )
        missing = [u for u in units if u not in stored]
        for i in range(0, len(missing), COARSE_BATCH):
            try:
                _build(level, missing[i : i + COARSE_BATCH])
            except IntegrityError:
                continue


def _build(level: str, units: list[datetime.datetime]) -> None:
    """Store the coarse rows of these hours or days, those whose parts (windows, or hours)
    are all stored once their hours are locked."""
    size = LEVELS[level]
    part_size = WINDOW if level == RollupLevel.HOUR else HOUR
    per_unit = int(size / part_size)
    since, until = units[0], units[-1] + size
    with transaction.atomic():
        _lock(since, until)
        part_starts: Iterable[datetime.datetime]
        if level == RollupLevel.HOUR:
            part_starts = CallRollupBucket.objects.filter(
                bucket__gte=since, bucket__lt=until
            ).values_list("bucket", flat=True)
        else:
            part_starts = CallRollupSpan.objects.filter(
                level=RollupLevel.HOUR, start__gte=since, start__lt=until
            ).values_list("start", flat=True)
        complete: dict[datetime.datetime, int] = {}
        for moment in part_starts:
            unit = unit_of(moment, size)
            complete[unit] = complete.get(unit, 0) + 1
        already = set(
            CallRollupSpan.objects.filter(level=level, start__in=units).values_list(
                "start", flat=True
            )
        )
        ready = [u for u in units if complete.get(u) == per_unit and u not in already]
        if not ready:
            return
        # The markers first (a second builder fails here).
        CallRollupSpan.objects.bulk_create([CallRollupSpan(level=level, start=u) for u in ready])
        ids = dict(
            CallRollupSpan.objects.filter(level=level, start__in=ready).values_list("start", "id")
        )
        merged: dict[tuple[Any, ...], Row] = {}
        for row in _parts(level, ready[0], ready[-1] + size):
            unit = unit_of(row.bucket, size)
            if unit not in ids:
                continue
            key = (unit, row.owner_id, row.model[:200], row.status)
            found = merged.get(key)
            if found is None:
                found = merged[key] = Row(unit, None, row.owner_id, key[2], row.status, "", False)
            found.add(row)
        CallRollupCoarse.objects.bulk_create(
            [
                CallRollupCoarse(
                    span_id=ids[row.bucket],
                    level=level,
                    start=row.bucket,
                    owner_id=row.owner_id,
                    model=row.model,
                    status=row.status,
                    # The call's total latency only: what a usage read reads.
                    latency={
                        name: lat.document()
                        for name, lat in row.latency.items()
                        if name in COARSE_LATENCIES and lat.count
                    },
                    **{name: getattr(row, name) for name in FIGURES},
                )
                for row in merged.values()
            ],
            batch_size=1000,
        )


def _parts(level: str, since: datetime.datetime, until: datetime.datetime) -> Iterator[Row]:
    """The stored rows an hour (windows' rows) or a day (hours' rows) is built from."""
    if level == RollupLevel.HOUR:
        stored = CallRollup.objects.filter(bucket_id__gte=since, bucket_id__lt=until)
        for values in stored.values_list("bucket_id", *_ROW_COLUMNS, *FIGURES, "latency").iterator(
            chunk_size=5000
        ):
            yield _stored_row(values[0], values[1:])
        return
    coarse = CallRollupCoarse.objects.filter(
        level=RollupLevel.HOUR, start__gte=since, start__lt=until
    )
    for values in coarse.values_list("start", *_COARSE_COLUMNS, *FIGURES, "latency").iterator(
        chunk_size=5000
    ):
        yield _coarse_row(values)


def _coarse_row(values: tuple[Any, ...]) -> Row:
    start, owner_id, model, status = values[:4]
    row = Row(start, None, owner_id, model, status, "", False)
    for name, value in zip(FIGURES, values[4:-1], strict=True):
        setattr(row, name, value)
    row.latency = {name: Latency.of(data) for name, data in (values[-1] or {}).items()}
    return row


def invalidate_late(*, started_at: datetime.datetime) -> None:
    """After a call is stored: if its window may be rolled up already, have it computed
    again (only for calls that ended past their window's grace): its marker, rows and the
    hour and day holding it are dropped, and its rows taken from the per-series totals."""
    start = window_of(started_at)
    if timezone.now() < start + WINDOW + GRACE:
        return
    with transaction.atomic():
        _lock(start, start + WINDOW)
        stored = CallRollup.objects.filter(bucket_id=start)
        rows = [
            _stored_row(values[0], values[1:])
            for values in stored.values_list("bucket_id", *_ROW_COLUMNS, *FIGURES, "latency")
        ]
        if not CallRollupBucket.objects.filter(bucket=start).delete()[0]:
            return
        _add_to_totals(rows, -1)
        CallRollupSpan.objects.filter(level=RollupLevel.HOUR, start=unit_of(start, HOUR)).delete()
        CallRollupSpan.objects.filter(level=RollupLevel.DAY, start=unit_of(start, DAY)).delete()


# Closed windows rolled up per read at most (the rest are computed from the calls this time,
# and stored by later reads or `roll_up`): a first read of a long range over a large ledger
# stays bounded.
STORE_PER_READ = 3000


def _closed_edge(now: datetime.datetime) -> datetime.datetime:
    """The end of the last closed window (those that ended at least GRACE ago)."""
    return window_of(now - GRACE)


def _rolled(since: datetime.datetime, until: datetime.datetime) -> set[datetime.datetime]:
    return set(
        CallRollupBucket.objects.filter(bucket__gte=since, bucket__lt=until).values_list(
            "bucket", flat=True
        )
    )


def _ensure_stored(since: datetime.datetime, until: datetime.datetime) -> None:
    """Store the closed windows of [since, until) not stored yet (up to STORE_PER_READ),
    and the hours and days inside it not built yet."""
    if until <= since:
        return
    expected = int((until - since) / WINDOW)
    # The common case, everything stored: one count, no list of windows.
    if CallRollupBucket.objects.filter(bucket__gte=since, bucket__lt=until).count() < expected:
        rolled = _rolled(since, until)
        missing = [w for w in _windows(since, until) if w not in rolled]
        if missing:
            _store(missing[:STORE_PER_READ])
    _store_coarse(since, until)


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
    closed_until = max(since, min(until, _closed_edge(now)))
    if store:
        _ensure_stored(since, closed_until)
    with sql.repeatable_read():
        yield from _window_rows(list(_windows(since, until)), closed_until, owner_id)


def _window_rows(
    windows: list[datetime.datetime], closed_until: datetime.datetime, owner_id: int | None
) -> Iterator[Row]:
    """The rows of these windows (ascending): stored ones where rolled up, computed from the
    calls for the rest."""
    if not windows:
        return
    rolled = _rolled(windows[0], min(windows[-1] + WINDOW, closed_until))
    chosen = [w for w in windows if w in rolled]
    whole = len(chosen) == int((chosen[-1] + WINDOW - chosen[0]) / WINDOW) if chosen else False
    # A contiguous run of stored windows: one range; otherwise the windows by name.
    for part in [chosen] if whole else [chosen[i : i + 500] for i in range(0, len(chosen), 500)]:
        if not part:
            continue
        if whole:
            stored = CallRollup.objects.filter(bucket_id__gte=part[0], bucket_id__lte=part[-1])
        else:
            stored = CallRollup.objects.filter(bucket_id__in=part)
        if owner_id is not None:
            stored = stored.filter(owner_id=owner_id)
        for values in stored.values_list("bucket_id", *_ROW_COLUMNS, *FIGURES, "latency").iterator(
            chunk_size=5000
        ):
            yield _stored_row(values[0], values[1:])
    # Everything not rolled up, computed from the calls: in spans of consecutive windows.
    for first, last in _spans([w for w in windows if w not in rolled]):
        yield from _rows_from_calls(first, last + WINDOW, owner_id=owner_id).values()


def rows_for_periods(
    *,
    bounds: list[datetime.datetime],
    owner_id: int | None = None,
    now: datetime.datetime | None = None,
    store: bool = True,
) -> Iterator[Row]:
    """The rows of the periods between consecutive `bounds` (UTC, each on a window's
    start), of `owner_id`'s calls when given, each row inside one period: each period is
    covered by the largest stored units that fit in it, days, then hours (per owner, model
    and status: `session_id`, `wire` and `stream` are None, "" and False), then windows (as
    `rows`). The figures equal `rows`' summed per period."""
    now = now or timezone.now()
    if len(bounds) < 2:
        return
    bounds = [window_of(bound) for bound in bounds]
    since, until = bounds[0], bounds[-1]
    closed_until = max(since, min(until, _closed_edge(now)))
    if store:
        _ensure_stored(since, closed_until)
    with sql.repeatable_read():
        days: list[datetime.datetime] = []
        hours: list[datetime.datetime] = []
        windows: list[datetime.datetime] = []
        for a, b in zip(bounds, bounds[1:], strict=False):
            cursor, end = a, min(b, closed_until)
            while cursor < b:
                if cursor + DAY <= end and unit_of(cursor, DAY) == cursor:
                    days.append(cursor)
                    cursor += DAY
                elif cursor + HOUR <= end and unit_of(cursor, HOUR) == cursor:
                    hours.append(cursor)
                    cursor += HOUR
                else:
                    windows.append(cursor)
                    cursor += WINDOW
        # Units not stored (yet) fall back to the next level down.
        stored_days = _stored_spans(RollupLevel.DAY, days)
        for day in days:
            if day not in stored_days:
                hours.extend(_units(day, day + DAY, HOUR))
        stored_hours = _stored_spans(RollupLevel.HOUR, hours)
        for hour in hours:
            if hour not in stored_hours:
                windows.extend(_windows(hour, hour + HOUR))
        for spans in (stored_days, stored_hours):
            # By span id: one integer per row, no timestamp to convert.
            starts = {span_id: start for start, span_id in spans.items()}
            chosen = sorted(starts)
            for i in range(0, len(chosen), 500):
                coarse = CallRollupCoarse.objects.filter(span_id__in=chosen[i : i + 500])
                if owner_id is not None:
                    coarse = coarse.filter(owner_id=owner_id)
                for values in coarse.values_list(
                    "span_id", *_COARSE_COLUMNS, *FIGURES, "latency"
                ).iterator(chunk_size=5000):
                    yield _coarse_row((starts[values[0]], *values[1:]))
        yield from _window_rows(sorted(windows), closed_until, owner_id)


def _stored_spans(level: str, units: list[datetime.datetime]) -> dict[datetime.datetime, int]:
    """The stored ones of these hours or days: their span ids by start."""
    found: dict[datetime.datetime, int] = {}
    chosen = sorted(units)
    for i in range(0, len(chosen), 500):
        found.update(
            CallRollupSpan.objects.filter(level=level, start__in=chosen[i : i + 500]).values_list(
                "start", "id"
            )
        )
    return found


def series_rows(*, now: datetime.datetime | None = None) -> list[Row]:
    """Every call's figures per series (wire, model, status, stream; `bucket`, `session_id`
    and `owner_id` mean nothing): the per-series totals of the stored windows, and rows
    computed from the calls of the others, read in one snapshot (PostgreSQL) or read again
    if a window was stored or dropped meanwhile (SQLite). What /metrics reads: about one row
    per series, however many calls."""
    now = now or timezone.now()
    first = _first_window()
    if first is None:
        return []
    edge = max(first, _closed_edge(now))
    _ensure_stored(first, edge)
    found: list[Row] = []
    for _ in range(5):
        with sql.repeatable_read():
            before = _markers_signature()
            found = list(_series_rows(first, edge, now))
            if _markers_signature() == before:
                break
    return found


def _markers_signature() -> tuple[Any, ...]:
    """What changes when a window is stored or dropped (the totals change with it)."""
    return tuple(
        CallRollupBucket.objects.aggregate(n=Count("bucket"), last=Max("computed_at")).values()
    )


def _series_rows(
    first: datetime.datetime, edge: datetime.datetime, now: datetime.datetime
) -> Iterator[Row]:
    for total in CallSeriesTotal.objects.order_by("id"):
        if not total.calls:
            continue
        row = Row(_EPOCH, None, None, total.model, total.status, total.wire, total.stream)
        for name in FIGURES:
            setattr(row, name, getattr(total, name))
        row.latency = {name: Latency.of(data) for name, data in total.latency.items()}
        yield row
    # Windows not stored: closed ones past STORE_PER_READ or dropped for a late call (rare:
    # found by a count first), and the open ones.
    expected = int((edge - first) / WINDOW)
    holes: list[datetime.datetime] = []
    if CallRollupBucket.objects.filter(bucket__gte=first, bucket__lt=edge).count() < expected:
        rolled = _rolled(first, edge)
        holes = [w for w in _windows(first, edge) if w not in rolled]
    for start, last in _spans(holes):
        yield from _rows_from_calls(start, last + WINDOW).values()
    yield from _rows_from_calls(edge, window_of(now) + WINDOW).values()


def _first_window() -> datetime.datetime | None:
    """The first window holding a call or a marker."""
    marker = CallRollupBucket.objects.order_by("bucket").values_list("bucket", flat=True).first()
    call = Call.objects.order_by("started_at").values_list("started_at", flat=True).first()
    found = [window_of(moment) for moment in (marker, call) if moment is not None]
    return min(found) if found else None


def _windows(since: datetime.datetime, until: datetime.datetime) -> Iterable[datetime.datetime]:
    return _units(since, until, WINDOW)


def _units(
    since: datetime.datetime, until: datetime.datetime, size: datetime.timedelta
) -> Iterable[datetime.datetime]:
    cursor = since
    while cursor < until:
        yield cursor
        cursor += size


def _spans(windows: list[datetime.datetime]) -> list[tuple[datetime.datetime, datetime.datetime]]:
    spans: list[tuple[datetime.datetime, datetime.datetime]] = []
    for window in windows:
        if spans and spans[-1][1] + WINDOW == window:
            spans[-1] = (spans[-1][0], window)
        else:
            spans.append((window, window))
    return spans


def roll_up(*, since: datetime.datetime, until: datetime.datetime) -> int:
    """Store every closed window from `since` to `until` not rolled up yet, and the hours and
    days they complete; how many windows were stored."""
    edge = min(window_of(until), _closed_edge(timezone.now()))
    start = window_of(since)
    if edge <= start:
        return 0
    rolled = _rolled(start, edge)
    missing = [w for w in _windows(start, edge) if w not in rolled]
    _store(missing)
    _store_coarse(start, edge)
    return len(missing)


def level_counts() -> dict[str, int]:
    """Stored rows per level (the bench prints them)."""
    counts = {"window": CallRollup.objects.count()}
    for level, n in (
        CallRollupCoarse.objects.values_list("level").annotate(n=Count("id")).order_by()
    ):
        counts[level] = n
    return counts
