"""Dashboard benchmark (issue 4): the sessions list with 1,000 sessions must render in under
1 s of server time; (issue 25) the session page of a summarized session costs the same at
12,000 events as at 3,000 (time ratio ≤ 1.2) and weighs ≤ 150 KiB. Prints one markdown table.

    .venv/bin/python bench/bench_dashboard.py [--sessions 1000] [--runs 7]

Runs on the embedded profile against a throwaway SQLite database in a temporary VAR_DIR (the
dev database is never touched). Sessions are made with bulk_create, with counters spread so
some are near their limit, some were compacted and some have a compaction running. Each page
is fetched through django.test.Client (the whole Django stack: middleware, view, queries,
templates) once to warm up, then `--runs` times; the table gives the median.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_SECONDS = 1.0
FLAT_RATIO = 1.2
FIRST_PAINT_BYTES = 150 * 1024
MODELS = [
    ("gpt-4o", 128_000, "o200k_base"),
    ("claude-3.5-sonnet", 200_000, "cl100k_base"),
    ("gemini-3-pro", 1_000_000, "cl100k_base"),
]


def _setup(var_dir: str) -> None:
    # Settings are read once, at setup: the throwaway VAR_DIR and the embedded profile first.
    os.environ["VAR_DIR"] = var_dir
    for name in ("DATABASE_URL", "REDIS_URL"):
        os.environ.pop(name, None)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", interactive=False, verbosity=0)


def _populate(count: int) -> tuple[object, uuid.UUID]:
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from compaction_app.models import CompactionRun, RunStatus
    from sessions_app.models import Event, Session
    from sessions_app.session_settings import DEFAULTS

    staff = get_user_model().objects.create_user("bench", password="bench", is_staff=True)
    now = timezone.now()
    sessions = []
    for index in range(count):
        model, limit, encoding = MODELS[index % len(MODELS)]
        fill = (index * 37 % 100) / 100  # 0 … 0.99 of the window, spread evenly
        active_events = 10 + index % 200
        compacted = index % 5 == 0
        sessions.append(
            Session(
                owner=staff,
                title=f"Bench session {index:04d}: refactor module {index % 50}",
                model=model,
                encoding=encoding,
                context_limit=limit,
                settings=dict(DEFAULTS),
                last_seq=active_events * 2,
                event_count=active_events * 2,
                active_event_count=active_events,
                active_tokens=max(int(limit * fill) - 3, 1),
                ledger_tokens=int(limit * fill) * 2,
                cumulative_tokens=int(limit * fill),
                reported_prompt_tokens=index * 1_000,
                reported_completion_tokens=index * 100,
                reported_total_tokens=index * 1_100,
                reported_event_count=active_events // 2,
                last_compaction=(
                    {
                        "id": str(uuid.uuid4()),
                        "strategy": "summarize",
                        "trigger": "auto",
                        "status": "completed",
                        "tokensBefore": int(limit * 0.85),
                        "tokensAfter": int(limit * fill),
                        "reductionPercent": 42.0,
                        "finishedAt": now.isoformat(),
                    }
                    if compacted
                    else None
                ),
            )
        )
    Session.objects.bulk_create(sessions, batch_size=500)
    # A few runs in flight, so the list's "compacting…" lookup has something to find.
    CompactionRun.objects.bulk_create(
        [
            CompactionRun(
                session=session, strategy="summarize", trigger="auto", status=RunStatus.RUNNING
            )
            for session in sessions[:: max(count // 20, 1)]
        ]
    )
    # One long session for the session page: 2,000 events.
    big = sessions[1]
    events = [
        Event(
            session=big,
            seq=seq,
            type="USER_MESSAGE" if seq % 2 else "AGENT_MESSAGE",
            content=f"message {seq} " * 10,
            token_count=25,
        )
        for seq in range(1, 2001)
    ]
    Event.objects.bulk_create(events, batch_size=500)
    Session.objects.filter(pk=big.pk).update(
        last_seq=2000, event_count=2000, active_event_count=2000, active_tokens=50_000
    )
    return staff, big.pk


def _summarized(owner: object, *, events: int) -> uuid.UUID:
    """A long summarized session, the shape issue 25 measured: per turn a user message (kept),
    a tool call, its result and an agent reply, then a summarize compaction whose marker
    folds them and the previous summary. Written with bulk_create (the page reads what the
    services would have stored)."""
    from django.db import transaction
    from django.utils import timezone

    from compaction_app.models import CompactionRun, RunningSummary, RunStatus
    from sessions_app.models import Event, Session
    from sessions_app.session_settings import DEFAULTS

    session = Session.objects.create(
        owner=owner,
        title=f"Summarized, {events:,} events",
        model="gpt-4o",
        encoding="o200k_base",
        context_limit=128_000,
        settings=dict(DEFAULTS),
    )
    now = timezone.now()
    rows: list[Event] = []
    runs: list[CompactionRun] = []
    previous: Event | None = None
    summary = "## Status\n" + "\n".join(f"- fixed src/mod_{n}.py [#{n}]" for n in range(40))
    seq = 0
    kept_tokens = 0
    while seq + 5 <= events:
        turn = seq // 5
        batch = []
        for kind, content, tokens in (
            ("USER_MESSAGE", f"Step {turn}: fix src/mod_{turn}.py.", 15),
            ("TOOL_CALL", f'{{"path": "tests/test_mod_{turn}.py"}}', 17),
            ("TOOL_RESULT", f"tests/test_mod_{turn}.py: 1 failed (E{turn}), 11 passed", 23),
            ("AGENT_MESSAGE", f"Fixed src/mod_{turn}.py: error E{turn} is gone.", 20),
        ):
            seq += 1
            batch.append(
                Event(
                    session=session,
                    seq=seq,
                    type=kind,
                    content=content,
                    token_count=tokens,
                    name="run_tests" if kind.startswith("TOOL") else "",
                    tool_call_id=f"call-{turn}" if kind.startswith("TOOL") else "",
                )
            )
        seq += 1
        marker = Event(
            session=session, seq=seq, type="COMPACTION", content=summary, token_count=900
        )
        for event in batch[1:]:
            event.compacted_by_id = marker.pk
        if previous is not None:
            previous.compacted_by_id = marker.pk
        kept_tokens += 15
        rows += [*batch, marker]
        runs.append(
            CompactionRun(
                session=session,
                strategy="summarize",
                summarizer="local",
                trigger="auto",
                status=RunStatus.COMPLETED,
                tokens_before=kept_tokens + 960,
                tokens_after=kept_tokens + 903,
                events_before=turn + 5,
                events_after=turn + 2,
                summary_tokens=900,
                folded_count=4,
                compaction_event_id=marker.pk,
                started_at=now,
                finished_at=now,
            )
        )
        previous = marker
    with transaction.atomic():
        Event.objects.bulk_create(rows, batch_size=1000)
        CompactionRun.objects.bulk_create(runs, batch_size=1000)
        RunningSummary.objects.create(session=session, summary=summary, token_count=896)
        Session.objects.filter(pk=session.pk).update(
            last_seq=seq,
            event_count=seq,
            active_event_count=seq // 5 + 1,
            active_tokens=kept_tokens + 900,
            reported_event_count=0,
        )
    return session.pk


def _median_ms(client: object, url: str, runs: int) -> tuple[float, int, int]:
    response = client.get(url)  # warm-up: template compilation, genai-prices snapshot
    assert response.status_code == 200, (url, response.status_code)
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        response = client.get(url)
        times.append(time.perf_counter() - started)
        assert response.status_code == 200
    return statistics.median(times) * 1000, len(response.content), response.status_code


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-dashboard-") as var_dir:
        _setup(var_dir)
        from django.test import Client

        staff, big_id = _populate(args.sessions)
        small_id = _summarized(staff, events=3_000)
        large_id = _summarized(staff, events=12_000)
        client = Client()
        client.force_login(staff)
        pages = [
            ("sessions list, first page", "/", True),
            (
                "sessions list, near limit + text + sort by usage",
                "/?near=1&q=module+1&sort=-usage",
                True,
            ),
            ("sessions list, one model, page 3", "/?model=claude-3.5-sonnet&page=3", True),
            ("sessions list, htmx table partial", "/?near=1", True),
            ("session page, 2,000 events, latest window shown", f"/sessions/{big_id}/", False),
            ("session page, 2,000 events, all shown", f"/sessions/{big_id}/?all=1", False),
            ("session page, summarized, 3,000 events", f"/sessions/{small_id}/", False),
            ("session page, summarized, 12,000 events", f"/sessions/{large_id}/", False),
        ]
        print(
            f"Dashboard, embedded profile (SQLite), {args.sessions:,} sessions, median of {args.runs} runs"
        )
        print()
        print("| page | median server time | response size | target | ok |")
        print("|---|---:|---:|---|---|")
        summarized: dict[str, tuple[float, int]] = {}
        for label, url, gated in pages:
            headers = (
                {"HTTP_HX_REQUEST": "true", "HTTP_HX_TARGET": "sessions-table"}
                if "partial" in label
                else {}
            )
            if headers:
                client.defaults.update(headers)
            ms, size, _ = _median_ms(client, url, args.runs)
            for key in headers:
                client.defaults.pop(key)
            if "summarized" in label:
                summarized[label] = (ms, size)
            target = f"< {TARGET_SECONDS * 1000:.0f} ms" if gated else "—"
            ok = ("yes" if ms < TARGET_SECONDS * 1000 else "NO") if gated else "—"
            print(f"| {label} (`{url}`) | {ms:.1f} ms | {size / 1024:.0f} KiB | {target} | {ok} |")
        # Issue 25: the session page's cost stays flat as the session grows.
        (small_ms, small_size), (large_ms, large_size) = summarized.values()
        ratio = large_ms / small_ms
        flat = ratio <= FLAT_RATIO and max(small_size, large_size) <= FIRST_PAINT_BYTES
        print(
            f"| session page, 12,000 vs 3,000 events (time ratio; first paint) | {ratio:.2f} × "
            f"| {large_size / 1024:.0f} KiB | ≤ {FLAT_RATIO} ×, ≤ {FIRST_PAINT_BYTES // 1024} KiB "
            f"| {'yes' if flat else 'NO'} |"
        )


if __name__ == "__main__":
    main()
