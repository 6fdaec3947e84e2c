"""Usage over time: the calls ledger per hour or day in the viewer's time zone, grouped by
model, user, session or status (selectors; read from the rollup, sessions_app.call_rollup:
its days and hours when the read is not per session, its 15-minute windows when it is).

Figures per period and group: calls, errors and the error rate, tokens by kind, cost, cache
hit rate (cache reads ÷ all input), p50 and p99 of the call's total latency (from the
rollup's histograms). Bill figures follow the calls ledger: every call counted, failures
included in the calls and the error rate."""

from __future__ import annotations

import datetime
import functools
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from zoneinfo import ZoneInfo, available_timezones

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser

from sessions_app import call_rollup, pricing
from sessions_app.models import CallStatus, Session

BUCKETS = ("hour", "day")
GROUPS = ("model", "user", "session", "status")
MAX_PERIODS = 1000
MAX_SERIES = 8
OTHER = "other"


@dataclass
class Cell:
    calls: int = 0
    errors: int = 0
    prompt_tokens: int = 0
    cached_input_tokens: int = 0
    cache_write_tokens: int = 0
    completion_tokens: int = 0
    cost_nano_usd: int = 0
    latency: call_rollup.Latency = field(default_factory=call_rollup.Latency)

    def add(self, row: call_rollup.Row) -> None:
        self.calls += row.calls
        if row.status != CallStatus.OK:
            self.errors += row.calls
        self.prompt_tokens += row.prompt_tokens
        self.cached_input_tokens += row.cached_input_tokens
        self.cache_write_tokens += row.cache_write_tokens
        self.completion_tokens += row.completion_tokens
        self.cost_nano_usd += row.cost_nano_usd
        if "total" in row.latency:
            self.latency.merge(row.latency["total"])

    def merge(self, other: Cell) -> None:
        for name in (
            "calls",
            "errors",
            "prompt_tokens",
            "cached_input_tokens",
            "cache_write_tokens",
            "completion_tokens",
            "cost_nano_usd",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.latency.merge(other.latency)

    def document(self) -> dict[str, Any]:
        return {
            "calls": self.calls,
            "errors": self.errors,
            "errorRate": round(100 * self.errors / self.calls, 1) if self.calls else None,
            "promptTokens": self.prompt_tokens,
            "cachedInputTokens": self.cached_input_tokens,
            "cacheWriteTokens": self.cache_write_tokens,
            "completionTokens": self.completion_tokens,
            "totalTokens": self.prompt_tokens + self.completion_tokens,
            "costUsd": pricing.usd(self.cost_nano_usd),
            "cacheHitRate": pricing.hit_rate(
                cached=self.cached_input_tokens, input_tokens=self.prompt_tokens
            ),
            "latencyMs": {
                "p50": self.latency.quantile(0.5),
                "p99": self.latency.quantile(0.99),
            },
        }


class BadRange(ValueError):
    pass


@functools.cache
def time_zones() -> tuple[str, ...]:
    """The IANA zone names the periods can be in: the time zone database's, less `localtime`
    (the server's own zone, not a name a viewer means). The API accepts exactly these and
    its schema lists them, so a name it documents is never refused. Read once: listing them
    opens every file of the database."""
    return tuple(sorted(name for name in available_timezones() if name != "localtime"))


def period_starts(
    *, since: datetime.datetime, until: datetime.datetime, bucket: str, tz: ZoneInfo
) -> list[datetime.datetime]:
    """The periods (local starts, aware) from the one holding `since` to the one before
    `until`: whole local hours or days."""
    start = since.astimezone(tz)
    if bucket == "day":
        start = start.replace(hour=0, minute=0, second=0, microsecond=0)
    else:
        start = start.replace(minute=0, second=0, microsecond=0)
    periods = []
    cursor = start
    while cursor.astimezone(datetime.UTC) < until:
        periods.append(cursor)
        if len(periods) > MAX_PERIODS:
            raise BadRange(f"at most {MAX_PERIODS} periods: a shorter range or a larger bucket")
        if bucket == "day":
            day = cursor.date() + datetime.timedelta(days=1)
            cursor = datetime.datetime(day.year, day.month, day.day, tzinfo=tz)
        else:
            cursor = (cursor.astimezone(datetime.UTC) + datetime.timedelta(hours=1)).astimezone(tz)
    return periods


def _period_of(moment: datetime.datetime, bucket: str, tz: ZoneInfo) -> datetime.datetime:
    local = moment.astimezone(tz)
    if bucket == "day":
        return datetime.datetime(local.year, local.month, local.day, tzinfo=tz)
    return local.replace(minute=0, second=0, microsecond=0)


def usage_over_time(
    *,
    user: AbstractBaseUser | AnonymousUser,
    since: datetime.datetime,
    until: datetime.datetime,
    bucket: str = "hour",
    group_by: str | None = None,
    tz: ZoneInfo | None = None,
    session_id: Any = None,
    user_id: int | None = None,
    max_series: int = MAX_SERIES,
) -> dict[str, Any]:
    """Calls per period (and group) over [since, until). A user sees their own calls; staff
    see every user's (or one user's: `user_id`)."""
    tz = tz or ZoneInfo("UTC")
    if bucket not in BUCKETS:
        raise BadRange(f"bucket must be one of {', '.join(BUCKETS)}")
    if group_by is not None and group_by not in GROUPS:
        raise BadRange(f"groupBy must be one of {', '.join(GROUPS)}")
    if until <= since:
        raise BadRange("until must be after since")
    periods = period_starts(since=since, until=until, bucket=bucket, tz=tz)
    owner = user.pk if not getattr(user, "is_staff", False) else user_id
    first = periods[0].astimezone(datetime.UTC)
    cells: dict[tuple[datetime.datetime, Any], Cell] = defaultdict(Cell)
    totals: dict[Any, Cell] = defaultdict(Cell)
    for row in _rows(
        periods, until, owner, by_session=session_id is not None or group_by == "session"
    ):
        if session_id is not None and str(row.session_id) != str(session_id):
            continue
        period = _period_of(row.bucket, bucket, tz)
        key = _group_key(row, group_by)
        cells[(period, key)].add(row)
        totals[key].add(row)
    ranked = sorted(totals, key=lambda k: (-totals[k].calls, str(k)))
    shown = ranked[:max_series]
    rest = ranked[max_series:]
    labels = _labels(group_by, shown)
    series = []
    for key in shown:
        series.append(
            {
                "key": str(key) if key is not None else "",
                "label": labels.get(key, str(key) if key is not None else "—"),
                "points": [cells[(p, key)].document() for p in periods],
                "totals": totals[key].document(),
            }
        )
    if rest:
        points = []
        for period in periods:
            merged = Cell()
            for key in rest:
                merged.merge(cells.get((period, key), Cell()))
            points.append(merged.document())
        other = Cell()
        for key in rest:
            other.merge(totals[key])
        series.append(
            {
                "key": OTHER,
                "label": f"{len(rest)} others",
                "points": points,
                "totals": other.document(),
            }
        )
    overall = Cell()
    by_period = [Cell() for _ in periods]
    index = {p: i for i, p in enumerate(periods)}
    for (period, _), cell in cells.items():
        overall.merge(cell)
        if period in index:
            by_period[index[period]].merge(cell)
    return {
        "since": first.isoformat().replace("+00:00", "Z"),
        "until": until.astimezone(datetime.UTC).isoformat().replace("+00:00", "Z"),
        "bucket": bucket,
        "tz": str(tz.key),
        "groupBy": group_by,
        "periods": [p.isoformat() for p in periods],
        "series": series,
        "points": [cell.document() for cell in by_period],
        "totals": overall.document(),
    }


def _rows(
    periods: list[datetime.datetime],
    until: datetime.datetime,
    owner: int | None,
    *,
    by_session: bool,
) -> Iterator[call_rollup.Row]:
    """The rollup rows of these periods: the 15-minute windows' (per session) when the read is
    per session; else each period from the largest stored level that fits in it (days,
    hours, windows: call_rollup.rows_for_periods), the same figures from fewer rows."""
    first = periods[0].astimezone(datetime.UTC)
    if by_session:
        return call_rollup.rows(since=first, until=until, owner_id=owner)
    end = call_rollup.window_of(until - datetime.timedelta(microseconds=1)) + call_rollup.WINDOW
    bounds = [p.astimezone(datetime.UTC) for p in periods] + [end]
    return call_rollup.rows_for_periods(bounds=bounds, owner_id=owner)


def _group_key(row: call_rollup.Row, group_by: str | None) -> Any:
    if group_by == "model":
        return row.model
    if group_by == "user":
        return row.owner_id
    if group_by == "session":
        return row.session_id
    if group_by == "status":
        return row.status
    return "all"


def _labels(group_by: str | None, keys: list[Any]) -> dict[Any, str]:
    if group_by == "user":
        names = dict(
            get_user_model()
            .objects.filter(pk__in=[k for k in keys if k is not None])
            .values_list("pk", get_user_model().USERNAME_FIELD)
        )
        return {k: str(names.get(k, "deleted user")) for k in keys}
    if group_by == "session":
        titles = {
            s.pk: str(s) for s in Session.objects.filter(pk__in=[k for k in keys if k is not None])
        }
        return {k: titles.get(k, "deleted session") for k in keys}
    if group_by is None:
        return {"all": "all calls"}
    return {k: str(k) or "—" for k in keys}
