"""The usage page's context: the range and grouping a form sends, the figures
(sessions_app.usage_over_time) and their charts (usage_chart)."""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any
from zoneinfo import ZoneInfo

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser

from compaction_app.dashboard.usage_chart import COLOURS, chart
from sessions_app import usage_over_time

RANGES = {
    "24h": (datetime.timedelta(hours=24), "hour"),
    "7d": (datetime.timedelta(days=7), "hour"),
    "30d": (datetime.timedelta(days=30), "day"),
    "90d": (datetime.timedelta(days=90), "day"),
}


class BadUsage(ValueError):
    pass


def page(
    *, user: AbstractBaseUser | AnonymousUser, params: Mapping[str, str], tz: ZoneInfo
) -> dict[str, Any]:
    chosen = params.get("range") or "24h"
    if chosen not in RANGES:
        raise BadUsage(f"range: one of {', '.join(RANGES)}")
    span, default_bucket = RANGES[chosen]
    bucket = params.get("bucket") or default_bucket
    group_by = params.get("group") or "model"
    if group_by == "none":
        group_by = ""
    until = datetime.datetime.now(datetime.UTC)
    try:
        data = usage_over_time.usage_over_time(
            user=user,
            since=until - span,
            until=until,
            bucket=bucket,
            group_by=group_by or None,
            tz=tz,
        )
    except usage_over_time.BadRange as exc:
        raise BadUsage(str(exc)) from None
    fmt = "%H:%M" if bucket == "hour" and span <= datetime.timedelta(days=1) else "%m-%d"
    if bucket == "hour" and span > datetime.timedelta(days=1):
        fmt = "%m-%d %H:%M"
    labels = [datetime.datetime.fromisoformat(p).strftime(fmt) for p in data["periods"]]
    series = data["series"]
    calls_chart = chart(
        labels=labels, stacks=[(s["label"], [p["calls"] for p in s["points"]]) for s in series]
    )
    cost_chart = chart(
        labels=labels,
        stacks=[(s["label"], [p["costUsd"] for p in s["points"]]) for s in series],
        money=True,
    )
    tokens_chart = chart(
        labels=labels,
        stacks=[
            (
                "uncached input",
                [
                    max(p["promptTokens"] - p["cachedInputTokens"] - p["cacheWriteTokens"], 0)
                    for p in data["points"]
                ],
            ),
            ("cache read", [p["cachedInputTokens"] for p in data["points"]]),
            ("cache write", [p["cacheWriteTokens"] for p in data["points"]]),
            ("output", [p["completionTokens"] for p in data["points"]]),
        ],
    )
    latency_chart = chart(
        labels=labels,
        lines=[
            ("p50", [p["latencyMs"]["p50"] for p in data["points"]]),
            ("p99", [p["latencyMs"]["p99"] for p in data["points"]]),
        ],
    )
    return {
        "data": data,
        "series": [{**s, "colour": COLOURS[i % len(COLOURS)]} for i, s in enumerate(series)],
        "charts": {
            "calls": calls_chart,
            "cost": cost_chart,
            "tokens": tokens_chart,
            "latency": latency_chart,
        },
        "token_kinds": [
            ("uncached input", COLOURS[0]),
            ("cache read", COLOURS[1]),
            ("cache write", COLOURS[2]),
            ("output", COLOURS[3]),
        ],
        "range": chosen,
        "ranges": list(RANGES),
        "bucket": bucket,
        "group": group_by or "none",
        "groups": [*usage_over_time.GROUPS, "none"],
        "tz_name": tz.key,
    }
