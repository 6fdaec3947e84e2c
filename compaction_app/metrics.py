"""Prometheus metrics (`/metrics`), computed from the shared state every process sees.

Calls, tokens, cost and latency come from the calls ledger (its per-series totals of the
rolled-up windows plus the calls not rolled up yet, read in one snapshot:
sessions_app.call_rollup.series_rows), compactions from the runs table, the
queue depth from the broker, stale runs from the runs' heartbeats, websocket connections
from each server process's count in Redis (in process memory on the embedded profile). So
any process answers the same numbers, however many ASGI processes and workers run, and a
restart resets nothing: counters are the ledger's own totals (a deleted session's calls stay
in the rollup, so they do not go down).

Names follow Prometheus' conventions: a `ledger_` prefix, base units (seconds, USD) in the
name, `_total` on counters.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import os
import socket
import threading
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

from django.conf import settings
from django.db.models import Count
from django.utils import timezone
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector, CollectorRegistry

from compaction_app.models import ACTIVE_STATUSES, CompactionRun, RunStatus
from sessions_app import call_rollup

logger = logging.getLogger("compaction_app.metrics")

# Histogram bounds, in milliseconds: each is an edge of the rollup's histograms.
BOUNDS_MS = (5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 25000, 60000, 150000, 600000)
assert all(bound in call_rollup.EDGES_MS for bound in BOUNDS_MS)


def _histogram(name: str, doc: str, labels: list[str]) -> HistogramMetricFamily:
    return HistogramMetricFamily(name, doc, labels=labels)


def _buckets(latency: call_rollup.Latency) -> list[tuple[str, float]]:
    out = []
    for bound in BOUNDS_MS:
        index = call_rollup.EDGES_MS.index(bound)
        count = sum(n for i, n in latency.h.items() if i <= index)
        out.append((repr(bound / 1000), float(count)))
    out.append(("+Inf", float(latency.count)))
    return out


class LedgerCollector(Collector):
    def collect(self) -> Iterator[Metric]:
        yield from _call_metrics()
        yield from _compaction_metrics()
        yield from _runtime_metrics()


def _call_metrics() -> Iterator[Metric]:
    calls = CounterMetricFamily(
        "ledger_gateway_calls",
        "Gateway calls, by wire, model and how they ended (failures included).",
        labels=["wire", "model", "status"],
    )
    tokens = CounterMetricFamily(
        "ledger_gateway_tokens",
        "Tokens the provider reported, by kind: input (uncached), cache_read, cache_write, output.",
        labels=["wire", "model", "kind"],
    )
    cost = CounterMetricFamily(
        "ledger_gateway_cost_usd",
        "What the calls cost, in US dollars (calls whose model has no price add nothing).",
        labels=["wire", "model"],
    )
    added = _histogram(
        "ledger_gateway_added_latency_seconds",
        "The gateway's own time before forwarding (arrival to the first send upstream).",
        ["wire"],
    )
    first_chunk = _histogram(
        "ledger_gateway_time_to_first_chunk_seconds",
        "Arrival to the provider's first chunk, streamed calls.",
        ["wire"],
    )
    duration = _histogram(
        "ledger_gateway_call_duration_seconds",
        "Arrival to the end of the answer.",
        ["wire"],
    )
    counts: dict[tuple[str, str, str], int] = defaultdict(int)
    kinds: dict[tuple[str, str, str], int] = defaultdict(int)
    dollars: dict[tuple[str, str], int] = defaultdict(int)
    lat: dict[tuple[str, str], call_rollup.Latency] = defaultdict(call_rollup.Latency)
    # One row per series (the stored windows' totals) and the calls not rolled up yet.
    for row in call_rollup.series_rows():
        counts[(row.wire, row.model, row.status)] += row.calls
        uncached = max(row.prompt_tokens - row.cached_input_tokens - row.cache_write_tokens, 0)
        for kind, value in (
            ("input", uncached),
            ("cache_read", row.cached_input_tokens),
            ("cache_write", row.cache_write_tokens),
            ("output", row.completion_tokens),
        ):
            kinds[(row.wire, row.model, kind)] += value
        dollars[(row.wire, row.model)] += row.cost_nano_usd
        for name in ("gateway", "total"):
            if name in row.latency:
                lat[(name, row.wire)].merge(row.latency[name])
        if row.stream and "ttfb" in row.latency:
            lat[("ttfb", row.wire)].merge(row.latency["ttfb"])
    for key, value in sorted(counts.items()):
        calls.add_metric(list(key), value)
    for key, value in sorted(kinds.items()):
        tokens.add_metric(list(key), value)
    for pair, nano in sorted(dollars.items()):
        cost.add_metric(list(pair), nano / 1e9)
    for (name, wire), latency in sorted(lat.items()):
        family = {"gateway": added, "ttfb": first_chunk, "total": duration}[name]
        family.add_metric([wire], _buckets(latency), latency.sum / 1000)
    yield from (calls, tokens, cost, added, first_chunk, duration)


def _compaction_metrics() -> Iterator[Metric]:
    runs = CounterMetricFamily(
        "ledger_compactions",
        "Finished compaction runs, by trigger and outcome (completed or failed).",
        labels=["trigger", "outcome"],
    )
    for trigger, status, n in (
        CompactionRun.objects.filter(status__in=[RunStatus.COMPLETED, RunStatus.FAILED])
        .values_list("trigger", "status")
        .annotate(n=Count("id"))
        .order_by()
    ):
        runs.add_metric([trigger, status], n)
    yield runs
    cutoff = timezone.now() - datetime.timedelta(seconds=float(settings.COMPACTION_STALE_SECONDS))
    stale = GaugeMetricFamily(
        "ledger_compaction_stale_runs",
        "Pending or running compactions with no heartbeat for COMPACTION_STALE_SECONDS (the "
        "sweeper clears them).",
        value=CompactionRun.objects.filter(
            status__in=ACTIVE_STATUSES, heartbeat_at__lt=cutoff
        ).count(),
    )
    active = GaugeMetricFamily(
        "ledger_compactions_active",
        "Pending or running compactions.",
        value=CompactionRun.objects.filter(status__in=ACTIVE_STATUSES).count(),
    )
    yield stale
    yield active


def queue_depth() -> int | None:
    """Tasks waiting in the Celery queue (None when the broker cannot be asked)."""
    from config.celery import app

    try:
        with app.connection_for_read() as connection:
            channel = connection.default_channel
            # Not passive: a queue no task was sent to yet is declared (empty), not an error.
            declared = channel.queue_declare(
                queue=settings.CELERY_TASK_DEFAULT_QUEUE, durable=True, auto_delete=False
            )
            return int(declared.message_count)
    except Exception:
        logger.warning("metrics: the broker's queue depth could not be read", exc_info=True)
        return None


def _runtime_metrics() -> Iterator[Metric]:
    depth = queue_depth()
    if depth is not None:
        yield GaugeMetricFamily(
            "ledger_celery_queue_depth",
            "Tasks waiting in the Celery queue (compactions, indexing, webhooks).",
            value=depth,
        )
    yield GaugeMetricFamily(
        "ledger_websocket_connections",
        "Open websocket connections, every server process's.",
        value=websocket_connections(),
    )


def exposition() -> bytes:
    """The metrics in Prometheus' text format."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(LedgerCollector())
    return generate_latest(registry)


# --- websocket connections, across processes ------------------------------------------------

_open = 0
_open_lock = threading.Lock()
_refresher: asyncio.Task[None] | None = None
# A process's count in Redis lives this long past its last refresh (a killed process's
# count goes away by itself); a process with sockets open refreshes it every REFRESH.
TTL_SECONDS = 90
REFRESH_SECONDS = 30
_KEY = "ledger:metrics:ws:"


def _process_key() -> str:
    layer: Any = settings.CHANNEL_LAYERS["default"]
    prefix = (layer.get("CONFIG") or {}).get("prefix", "")
    return f"{_KEY}{prefix}:{socket.gethostname()}:{os.getpid()}"


def _redis() -> Any:
    if not settings.REDIS_URL:
        return None
    import redis

    return redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2)


_client: Any = None


def _publish() -> None:
    global _client
    try:
        if _client is None:
            _client = _redis()
        if _client is not None:
            _client.set(_process_key(), _open, ex=TTL_SECONDS)
    except Exception:
        logger.warning("metrics: the websocket count could not be published", exc_info=True)


async def _refresh_forever() -> None:
    while True:
        await asyncio.sleep(REFRESH_SECONDS)
        await asyncio.get_running_loop().run_in_executor(None, _publish)


def websocket_changed(delta: int) -> None:
    """A websocket of this process opened (+1) or closed (-1): the count is published off
    the event loop."""
    global _open, _refresher
    with _open_lock:
        _open = max(_open + delta, 0)
    if not settings.REDIS_URL:
        return
    loop = asyncio.get_running_loop()
    loop.run_in_executor(None, _publish)
    if _refresher is None or _refresher.done():
        _refresher = loop.create_task(_refresh_forever())


def websocket_connections() -> int:
    if not settings.REDIS_URL:
        return _open
    try:
        client = _redis()
        prefix = _process_key().rsplit(":", 2)[0] + ":"
        total = 0
        for key in client.scan_iter(match=prefix + "*", count=500):
            value = client.get(key)
            total += int(value or 0)
        return total
    except Exception:
        logger.warning("metrics: the websocket count could not be read", exc_info=True)
        return _open
