"""Ledger benchmarks (issue 2): bulk ingest vs. raw tiktoken, /usage at 100k events, and
concurrent appenders on PostgreSQL. Prints one markdown table.

    .venv/bin/python bench/bench_ledger.py [--profile embedded|postgres|both]

Every profile runs in a child process of this script (Django reads its settings once per
process) against a throwaway database: a SQLite file in a temporary VAR_DIR for `embedded`, a
`bench_ledger` database created and dropped on the local PostgreSQL for `postgres`. The dev
database is never touched. A child prints its rows as one JSON line prefixed by `BENCH_ROWS `.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from harness import Row, django_child, profile_main
from harness import row as _row

ROOT = Path(__file__).resolve().parent.parent
PG_DB = "bench_ledger"
BENCH_MODEL = "gpt-4.1"  # o200k_base, like the generator's calibration
# Keep the bench session clear of auto-compaction and refresh: those run as Celery jobs after
# the append and are not part of what is measured here.
BENCH_SETTINGS = {"autoCompact": False, "refreshThresholdTokens": 100_000_000}
BIG_SESSION_EVENTS = 100_000
BIG_EVENT_TOKENS = 12
SMALL_SESSION_EVENTS = 10
USAGE_REQUESTS = 200
WRITERS = 8
APPENDS_PER_WRITER = 500

# --- child: runs inside one profile's Django process -------------------------------------------


def _child(profile: str, ingest_runs: int) -> list[Row]:
    user, token = django_child(profile=profile, pg_db=PG_DB)

    figures = [
        ("bulk ingest", lambda: _bench_ingest(profile, user, token, ingest_runs)),
        ("GET /usage", lambda: _bench_usage(profile, user, token)),
    ]
    if profile == "postgres":
        figures.append(("concurrent writers", lambda: _bench_concurrent(profile, user)))
    rows: list[Row] = []
    for name, run in figures:
        # One figure failing (an API change, say) must not hide the others.
        try:
            rows += run()
        except Exception as exc:
            traceback.print_exc()
            rows.append(_row(profile, name, f"failed: {type(exc).__name__}: {exc}"[:300], ok=False))
    return rows


def _client(token: str) -> Any:
    from django.test import Client

    return Client(HTTP_AUTHORIZATION=f"Token {token}")


def _new_session(client: Any, title: str) -> str:
    response = client.post(
        "/api/v1/sessions",
        data=json.dumps(
            {
                "model": BENCH_MODEL,
                "title": title,
                "contextLimit": 2_000_000,
                "settings": BENCH_SETTINGS,
            }
        ),
        content_type="application/json",
    )
    assert response.status_code == 201, response.content[:500]
    return response.json()["id"]


def _bench_ingest(profile: str, user: Any, token: str, runs: int) -> list[Row]:
    from django.db.models import Sum

    from compaction_app.testkit.session_gen import generate_session
    from sessions_app import tokens
    from sessions_app.models import Event, Session

    generated = generate_session(turns=500, seed=7, target_tokens=940_000)
    events = generated.events
    body = json.dumps(events)  # the client's serialisation is not the server's cost

    counter = tokens.get_counter(tokens.resolve_encoding(BENCH_MODEL).encoding)
    encoding = getattr(counter, "_enc", None)
    if encoding is None:  # FallbackCounter: the vocabulary did not load
        raise RuntimeError(
            f"{counter!r}: tiktoken encoding unavailable, nothing exact to compare with"
        )
    texts = [
        e["content"] if isinstance(e["content"], str) else json.dumps(e["content"]) for e in events
    ]

    client = _client(token)
    # Warm-up: vocabulary load, URL resolution, serializer and DB code paths are paid once here.
    encoding.encode_ordinary("warm up the encoding")
    warm = _new_session(client, "warm-up")
    response = client.post(
        f"/api/v1/sessions/{warm}/events",
        data=json.dumps(events[:50]),
        content_type="application/json",
    )
    assert response.status_code == 201, response.content[:500]
    # The ASGI server freezes its start-up heap (config/asgi.py); do the same here so the
    # in-process client measures what a served request costs.
    import config.asgi  # noqa: F401

    # Wall time is the figure; process CPU time is shown beside it because on a shared machine
    # other processes' load moves wall time far more (PostgreSQL's own CPU is not in it).
    api_times: list[float] = []
    raw_times: list[float] = []
    api_cpu: list[float] = []
    raw_cpu: list[float] = []
    session_id = ""
    for run in range(runs):
        session_id = _new_session(client, f"ingest-{run}")
        started, cpu = time.perf_counter(), time.process_time()
        response = client.post(
            f"/api/v1/sessions/{session_id}/events", data=body, content_type="application/json"
        )
        api_times.append(time.perf_counter() - started)
        api_cpu.append(time.process_time() - cpu)
        assert response.status_code == 201, response.content[:500]
        assert len(response.json()) == len(events)

        started, cpu = time.perf_counter(), time.process_time()
        raw_tokens = 0
        for text in texts:  # what a naive client does: one call per message, one thread
            raw_tokens += len(encoding.encode_ordinary(text))
        raw_times.append(time.perf_counter() - started)
        raw_cpu.append(time.process_time() - cpu)

    stored = Event.objects.filter(session_id=session_id)
    stored_count = stored.count()
    stored_tokens = stored.aggregate(total=Sum("token_count"))["total"] or 0
    session = Session.objects.get(pk=session_id)
    consistent = stored_count == len(events) and session.ledger_tokens == stored_tokens

    api = statistics.median(api_times)
    raw = statistics.median(raw_times)
    ratio = api / raw
    cpu_api, cpu_raw = statistics.median(api_cpu), statistics.median(raw_cpu)
    label = (
        f"bulk ingest, {len(events):,} events / {stored_tokens:,} tokens (1 POST, median of {runs})"
    )
    return [
        _row(
            profile,
            label,
            f"{api:.3f} s (CPU {cpu_api:.3f} s)",
            "all stored, counter = sum",
            consistent,
        ),
        _row(
            profile,
            f"raw tiktoken encode_ordinary, same {raw_tokens:,} content tokens",
            f"{raw:.3f} s (CPU {cpu_raw:.3f} s)",
        ),
        _row(
            profile,
            "ingest / raw tiktoken",
            f"{ratio:.2f}× (CPU {cpu_api / cpu_raw:.2f}×)",
            "≤ 3",
            ratio <= 3,
        ),
    ]


def _bench_session(user: Any, title: str) -> Any:
    """A session of BENCH_MODEL with room for everything and no background jobs."""
    from sessions_app import services

    return services.session_create(
        owner=user,
        model=BENCH_MODEL,
        title=title,
        context_limit=100_000_000,
        settings=BENCH_SETTINGS,
    )


def _build_big_session(user: Any, events: int) -> Any:
    from django.db import transaction

    from sessions_app.models import Event, EventType, Session

    session = _bench_session(user, "usage-100k")
    kinds = [EventType.USER_MESSAGE, EventType.AGENT_MESSAGE]
    per_event = BIG_EVENT_TOKENS
    with transaction.atomic():
        batch: list[Event] = []
        for seq in range(1, events + 1):
            batch.append(
                Event(
                    session=session,
                    seq=seq,
                    type=kinds[seq % 2],
                    content=f"message {seq}",
                    token_count=per_event,
                )
            )
            if len(batch) == 5_000:
                Event.objects.bulk_create(batch)
                batch = []
        if batch:
            Event.objects.bulk_create(batch)
        # Counters exactly as event_append would have left them.
        Session.objects.filter(pk=session.pk).update(
            last_seq=events,
            event_count=events,
            active_event_count=events,
            active_tokens=events * per_event,
            ledger_tokens=events * per_event,
            cumulative_tokens=events * per_event,
        )
    session.refresh_from_db()
    return session


def _bench_usage(profile: str, user: Any, token: str) -> list[Row]:
    from sessions_app import services
    from sessions_app.services import EventInput

    started = time.perf_counter()
    big = _build_big_session(user, BIG_SESSION_EVENTS)
    build_seconds = time.perf_counter() - started
    small = _bench_session(user, "usage-10")
    services.event_append(
        session=small,
        events=[
            EventInput(type="USER_MESSAGE", content=f"message {i}")
            for i in range(SMALL_SESSION_EVENTS)
        ],
    )

    client = _client(token)
    paths = {
        "big": f"/api/v1/sessions/{big.pk}/usage",
        "small": f"/api/v1/sessions/{small.pk}/usage",
    }
    timings: dict[str, list[float]] = {"big": [], "small": []}
    bodies: dict[str, Any] = {}
    for i in range(USAGE_REQUESTS + 20):
        # Alternate the two sessions so drift (other load, caches) hits both alike.
        for key in ("big", "small") if i % 2 else ("small", "big"):
            started = time.perf_counter()
            response = client.get(paths[key])
            elapsed = time.perf_counter() - started
            assert response.status_code == 200, response.content[:500]
            if i >= 20:  # the first 20 rounds are warm-up
                timings[key].append(elapsed)
            bodies[key] = response.json()
    # The design's contract: contextTokens = sum of active events' counts + 3 for the reply primer.
    expected_context = BIG_SESSION_EVENTS * BIG_EVENT_TOKENS + 3
    assert bodies["big"]["contextTokens"] == expected_context, bodies["big"]
    big_ms = statistics.median(timings["big"]) * 1000
    small_ms = statistics.median(timings["small"]) * 1000
    ratio = big_ms / small_ms
    return [
        _row(
            profile,
            f"GET /usage, {BIG_SESSION_EVENTS:,}-event session (median of {USAGE_REQUESTS})",
            f"{big_ms:.2f} ms",
        ),
        _row(
            profile,
            f"GET /usage, {SMALL_SESSION_EVENTS}-event session (median of {USAGE_REQUESTS})",
            f"{small_ms:.2f} ms",
        ),
        _row(profile, "/usage 100k / 10 events", f"{ratio:.2f}×", "≤ 1.3", ratio <= 1.3),
        _row(
            profile,
            f"(setup: {BIG_SESSION_EVENTS:,} events bulk-inserted)",
            f"{build_seconds:.1f} s",
        ),
    ]


def _bench_concurrent(profile: str, user: Any) -> list[Row]:
    from django.db import connection
    from django.db.models import Count, Max, Q, Sum

    from sessions_app import services
    from sessions_app.models import MODEL_INVISIBLE_TYPES, Event, EventType, Session
    from sessions_app.services import EventInput, TokenUsage

    session = _bench_session(user, "concurrent")
    # Close the main thread's connection so every writer's work is on its own connection.
    connection.close()
    errors: list[BaseException] = []
    barrier = threading.Barrier(WRITERS + 1)

    def writer(number: int) -> None:
        try:
            target = Session.objects.get(pk=session.pk)
            barrier.wait()
            for i in range(APPENDS_PER_WRITER):
                kind = EventType.AGENT_MESSAGE if i % 2 else EventType.USER_MESSAGE
                usage = (
                    TokenUsage(prompt_tokens=i, completion_tokens=1, total_tokens=i + 1)
                    if i % 2
                    else None
                )
                services.event_append(
                    session=target,
                    events=[
                        EventInput(
                            type=kind,
                            content=f"writer {number} message {i} " * (1 + i % 5),
                            token_usage=usage,
                        )
                    ],
                )
        except BaseException as exc:  # reported in the table, not swallowed
            errors.append(exc)
            if not barrier.broken:
                barrier.abort()
        finally:
            connection.close()

    threads = [
        threading.Thread(target=writer, args=(n,), name=f"writer-{n}") for n in range(WRITERS)
    ]
    for thread in threads:
        thread.start()
    # A writer that failed before the start line breaks the barrier; its error is reported below.
    with contextlib.suppress(threading.BrokenBarrierError):
        barrier.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - started
    expected = WRITERS * APPENDS_PER_WRITER
    if errors:
        return [
            _row(
                profile,
                f"{WRITERS} concurrent writers × {APPENDS_PER_WRITER}",
                f"error: {errors[0]!r}",
                ok=False,
            )
        ]

    seqs = list(
        Event.objects.filter(session_id=session.pk).order_by("seq").values_list("seq", flat=True)
    )
    seq_ok = seqs == list(range(1, expected + 1))
    stored = Event.objects.filter(session_id=session.pk)
    sums = stored.aggregate(
        count=Count("id"),
        last=Max("seq"),
        ledger=Sum("token_count"),
        active=Count(
            "id", filter=Q(compacted_by__isnull=True) & ~Q(type__in=MODEL_INVISIBLE_TYPES)
        ),
        active_tokens=Sum(
            "token_count", filter=Q(compacted_by__isnull=True) & ~Q(type__in=MODEL_INVISIBLE_TYPES)
        ),
        cumulative=Sum("token_count", filter=~Q(type=EventType.CONTEXT_REFRESH)),
        prompt=Sum("prompt_tokens"),
        completion=Sum("completion_tokens"),
        total=Sum("total_tokens"),
        reported=Count("id", filter=Q(prompt_tokens__isnull=False) | Q(total_tokens__isnull=False)),
    )
    s = Session.objects.get(pk=session.pk)
    stored_counters = {
        "count": s.event_count,
        "last": s.last_seq,
        "ledger": s.ledger_tokens,
        "active": s.active_event_count,
        "active_tokens": s.active_tokens,
        "cumulative": s.cumulative_tokens,
        "prompt": s.reported_prompt_tokens,
        "completion": s.reported_completion_tokens,
        "total": s.reported_total_tokens,
        "reported": s.reported_event_count,
    }
    mismatched = sorted(k for k, v in stored_counters.items() if (sums[k] or 0) != v)
    connection.close()
    label = f"{WRITERS} concurrent writers × {APPENDS_PER_WRITER} single-event appends"
    return [
        _row(
            profile,
            f"{label}: seq",
            f"{len(seqs):,} events, seq 1..{seqs[-1] if seqs else 0}",
            f"exactly 1..{expected}",
            seq_ok,
        ),
        _row(
            profile,
            f"{label}: session counters vs. aggregate",
            "all equal" if not mismatched else "differ: " + ", ".join(mismatched),
            "equal",
            not mismatched,
        ),
        _row(
            profile,
            f"{label}: throughput",
            f"{expected / seconds:,.0f} appends/s ({seconds:.2f} s)",
        ),
    ]


# --- parent: one child per profile, one table ---------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    return profile_main(
        argv,
        title="Context Ledger benchmarks",
        description="Context Ledger benchmarks (issue 2).",
        script=__file__,
        pg_db=PG_DB,
        child=_child,
        option="--ingest-runs",
        default=5,
        help="bulk ingests per profile (median reported)",
        timeout=600,
    )


if __name__ == "__main__":
    raise SystemExit(main())
