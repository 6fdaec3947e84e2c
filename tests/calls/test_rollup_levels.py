"""The rollup's coarser levels (sessions_app.call_rollup): hours and days per owner, model and
status beside the 15-minute windows, and the per-series totals /metrics reads. A usage read
that is not per session answers from the largest stored level that fits each period, with
the same figures (p50/p99 from the merged histograms included) and the same scope as the
windows' answer; a call saved after its window was rolled up drops the window, its hour and
its day, and the totals follow; builders racing on the same windows store each once."""

from __future__ import annotations

import datetime
import random
import threading
from collections import defaultdict
from zoneinfo import ZoneInfo

import pytest
from django.db import close_old_connections, connection
from django.utils import timezone

from compaction_app import metrics
from sessions_app import call_rollup, usage_over_time
from sessions_app.calls import call_record
from sessions_app.models import (
    CallRollup,
    CallRollupBucket,
    CallRollupCoarse,
    CallRollupSpan,
    CallSeriesTotal,
)
from sessions_app.services import session_create

pytestmark = pytest.mark.django_db(transaction=True)

NOW = timezone.now()
MODELS = ("gpt-4o", "gpt-4o-mini", "claude-sonnet-4")


def _record(session, started_at, rng, *, model=None, status=None):
    model = model or rng.choice(MODELS)
    status = status or ("provider_error" if rng.random() < 0.15 else "ok")
    call_record(
        session_id=session.pk,
        owner_id=session.owner_id,
        started_at=started_at,
        wire="anthropic" if model.startswith("claude") else "openai",
        status=status,
        model_requested=model,
        model_served=model,
        http_status=200 if status == "ok" else 500,
        stream=rng.random() < 0.5,
        prompt_tokens=None if status != "ok" else rng.randint(100, 5000),
        cached_input_tokens=None if status != "ok" else rng.randint(0, 100),
        completion_tokens=None if status != "ok" else rng.randint(1, 500),
        ttfb_ms=rng.randint(5, 900),
        total_ms=rng.randint(20, 40000),
        gateway_ms=rng.randint(1, 30),
    )


@pytest.fixture
def ledger(alice, bob, staff):
    """Calls of three users over four days, across hours and day boundaries."""
    rng = random.Random(7)
    sessions = [
        session_create(owner=user, model="gpt-4o", title=f"{user.username} {n}")
        for user in (alice, bob, staff)
        for n in range(2)
    ]
    for _ in range(400):
        moment = NOW - datetime.timedelta(seconds=rng.uniform(0, 4 * 86400))
        _record(rng.choice(sessions), moment, rng)
    return sessions


def _from_windows(monkeypatch, **params):
    """The same read answered from the 15-minute windows only."""
    original = call_rollup.rows_for_periods

    def windows_only(*, bounds, owner_id=None, now=None, store=True):
        return call_rollup.rows(since=bounds[0], until=bounds[-1], owner_id=owner_id)

    monkeypatch.setattr(call_rollup, "rows_for_periods", windows_only)
    try:
        return usage_over_time.usage_over_time(**params)
    finally:
        monkeypatch.setattr(call_rollup, "rows_for_periods", original)


CASES = [
    {"bucket": "day", "group_by": "model", "tz": ZoneInfo("UTC")},
    {"bucket": "day", "group_by": "status", "tz": ZoneInfo("Asia/Kathmandu")},
    {"bucket": "day", "group_by": "user", "tz": ZoneInfo("America/New_York")},
    {"bucket": "hour", "group_by": "model", "tz": ZoneInfo("Asia/Kolkata")},
    {"bucket": "hour", "group_by": None, "tz": ZoneInfo("UTC")},
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c['bucket']}-{c['group_by']}-{c['tz']}")
def test_coarse_levels_answer_as_the_windows_do(ledger, alice, staff, monkeypatch, case):
    since = NOW - datetime.timedelta(days=5)
    for user in (staff, alice):
        params = {"user": user, "since": since, "until": NOW, **case}
        coarse = usage_over_time.usage_over_time(**params)
        windows = _from_windows(monkeypatch, **params)
        assert coarse == windows
        # Scope: alice's read counts her calls only, staff's everyone's.
        owned = {alice.pk} if user == alice else None
        expected = sum(
            r.calls
            for r in call_rollup.rows(since=since, until=NOW)
            if owned is None or r.owner_id in owned
        )
        assert coarse["totals"]["calls"] == expected
        assert coarse["totals"]["latencyMs"]["p99"] is not None
    # The days and hours were built and read.
    assert CallRollupSpan.objects.filter(level="day").count() >= 3
    assert CallRollupSpan.objects.filter(level="hour").count() >= 72
    assert CallRollupCoarse.objects.filter(level="day").exists()


def test_a_read_of_days_reads_day_rows_not_windows(ledger, staff):
    since = NOW - datetime.timedelta(days=5)
    periods = usage_over_time.period_starts(
        since=since, until=NOW, bucket="day", tz=ZoneInfo("UTC")
    )
    bounds = [p.astimezone(datetime.UTC) for p in periods]
    bounds.append(call_rollup.window_of(NOW) + call_rollup.WINDOW)
    list(call_rollup.rows_for_periods(bounds=bounds))  # stores everything closed
    coarse = list(call_rollup.rows_for_periods(bounds=bounds))
    windows = list(call_rollup.rows(since=bounds[0], until=bounds[-1]))
    assert sum(r.calls for r in coarse) == sum(r.calls for r in windows) == 400
    # Whole days from day rows (no session, no wire); only today's hours and windows besides.
    days = [r for r in coarse if r.bucket < bounds[-2]]
    assert days and all(r.session_id is None and r.wire == "" for r in days)
    assert {r.bucket for r in days} <= set(bounds)
    assert len(coarse) < len(windows) / 2


def test_a_late_call_drops_its_window_hour_and_day_and_the_totals_follow(ledger, staff):
    params = {
        "user": staff,
        "since": NOW - datetime.timedelta(days=5),
        "until": NOW,
        "bucket": "day",
        "group_by": "model",
    }
    before = usage_over_time.usage_over_time(**params)
    scraped = _series(call_rollup.series_rows())
    late = NOW - datetime.timedelta(days=2, hours=3)
    hour = call_rollup.unit_of(late, call_rollup.HOUR)
    day = call_rollup.unit_of(late, call_rollup.DAY)
    assert CallRollupSpan.objects.filter(level="hour", start=hour).exists()
    assert CallRollupSpan.objects.filter(level="day", start=day).exists()
    _record(ledger[0], late, random.Random(1), model="gpt-4o", status="ok")
    assert not CallRollupBucket.objects.filter(bucket=call_rollup.window_of(late)).exists()
    assert not CallRollupSpan.objects.filter(level="hour", start=hour).exists()
    assert not CallRollupSpan.objects.filter(level="day", start=day).exists()
    # The totals lost that window (it is read from the calls until stored again).
    after = _series(call_rollup.series_rows())
    assert sum(a["calls"] for a in after.values()) == sum(s["calls"] for s in scraped.values()) + 1
    again = usage_over_time.usage_over_time(**params)
    assert again["totals"]["calls"] == before["totals"]["calls"] + 1
    # Stored again, the hour and the day too, and the totals still equal the calls.
    assert CallRollupSpan.objects.filter(level="day", start=day).exists()
    assert _series(call_rollup.series_rows()) == _reference()


def _series(rows):
    out: dict = defaultdict(lambda: {"calls": 0, "tokens": 0, "cost": 0, "h": defaultdict(int)})
    for row in rows:
        cell = out[(row.wire, row.model, row.status, row.stream)]
        cell["calls"] += row.calls
        cell["tokens"] += row.prompt_tokens + row.completion_tokens + row.cached_input_tokens
        cell["cost"] += row.cost_nano_usd
        for name, latency in row.latency.items():
            for index, n in latency.h.items():
                cell["h"][(name, index)] += n
            cell["h"][(name, "sum")] += latency.sum
    return {
        k: {**v, "h": {i: n for i, n in v["h"].items() if n}} for k, v in out.items() if v["calls"]
    }


def _reference():
    """Every call's figures per series, computed from the calls themselves."""
    first = NOW - datetime.timedelta(days=6)
    return _series(call_rollup._rows_from_calls(first, NOW + datetime.timedelta(hours=1)).values())


def test_metrics_read_one_row_per_series_equal_to_the_calls(ledger):
    assert _series(call_rollup.series_rows()) == _reference()
    # Everything closed is stored: the totals hold it, a row per series.
    series = CallSeriesTotal.objects.count()
    assert 0 < series <= len(MODELS) * 2 * 2
    assert sum(t.calls for t in CallSeriesTotal.objects.all()) <= 400
    text = metrics.exposition().decode()
    calls = sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("ledger_gateway_calls_total{")
    )
    assert calls == 400
    # A second scrape is the same.
    assert _series(call_rollup.series_rows()) == _reference()


def test_builders_racing_on_the_same_windows_store_each_once(ledger, staff):
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def build():
        try:
            start.wait()
            call_rollup.roll_up(since=NOW - datetime.timedelta(days=5), until=NOW)
            call_rollup.series_rows()
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            close_old_connections()
            connection.close()

    threads = [threading.Thread(target=build) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    windows = CallRollupBucket.objects.count()
    assert windows == len(set(CallRollupBucket.objects.values_list("bucket", flat=True)))
    assert sum(CallRollup.objects.values_list("calls", flat=True)) <= 400
    assert _series(call_rollup.series_rows()) == _reference()
    hours = CallRollupSpan.objects.filter(level="hour")
    assert hours.count() == len(set(hours.values_list("start", flat=True)))
    for level in ("hour", "day"):
        assert sum(
            CallRollupCoarse.objects.filter(level=level).values_list("calls", flat=True)
        ) == sum(
            CallRollup.objects.filter(
                bucket_id__gte=min(
                    CallRollupSpan.objects.filter(level=level).values_list("start", flat=True)
                )
            )
            .filter(
                bucket_id__lt=max(
                    CallRollupSpan.objects.filter(level=level).values_list("start", flat=True)
                )
                + call_rollup.LEVELS[level]
            )
            .values_list("calls", flat=True)
        )
