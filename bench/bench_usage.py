"""Usage over time and /metrics on a large calls ledger: N calls (default 1,000,000) over 30
days, 2,000 sessions of 20 users, 4 models, ~3 % failures, on the embedded profile (SQLite in
a temporary VAR_DIR). Times the usage API's selector for 30 days per day by model, 24 hours
per hour by session, 30 days per day by model in a zone whose days are not UTC's (read from
the hour level), and the /metrics exposition: the first read (which rolls up the closed
15-minute windows it needs, and the hours and days they complete) and the next ones (read
from the rollup's days, hours and windows, and /metrics from its per-series totals).

    .venv/bin/python bench/bench_usage.py [--calls 1000000]
"""

from __future__ import annotations

import argparse
import datetime
import os
import random
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=1_000_000)
    args = parser.parse_args()
    var_dir = tempfile.mkdtemp(prefix="bench-usage-")
    for name in ("DATABASE_URL", "REDIS_URL"):
        os.environ.pop(name, None)
    os.environ.update(VAR_DIR=var_dir, DJANGO_SETTINGS_MODULE="config.settings")
    sys.path.insert(0, str(ROOT))
    os.chdir(ROOT)
    import django

    django.setup()
    from zoneinfo import ZoneInfo

    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.utils import timezone

    from compaction_app import metrics
    from sessions_app import call_rollup, usage_over_time
    from sessions_app.models import Call, CallRollup, Session

    call_command("migrate", verbosity=0, interactive=False)
    rng = random.Random(40)
    users = [
        get_user_model().objects.create_user(username=f"u{n}", is_staff=n == 0) for n in range(20)
    ]
    sessions = Session.objects.bulk_create(
        Session(
            owner=users[n % 20],
            title=f"agent run {n}",
            model="gpt-4o",
            encoding="o200k_base",
            context_limit=128_000,
        )
        for n in range(2000)
    )
    now = timezone.now()
    models = ("gpt-4o", "gpt-4o-mini", "claude-3.5-sonnet", "gemini-2.5-pro")
    started = time.perf_counter()
    batch = []
    # Each session works in bursts: a start within the 30 days, a call every few seconds.
    per_session = args.calls // len(sessions)
    for session in sessions:
        begin = now - datetime.timedelta(seconds=rng.uniform(3600, 30 * 86400))
        model = rng.choice(models)
        for n in range(per_session):
            moment = begin + datetime.timedelta(seconds=n * rng.uniform(2, 12))
            failed = rng.random() < 0.03
            batch.append(
                Call(
                    id=uuid.uuid4(),
                    session_id=session.pk,
                    owner_id=session.owner_id,
                    started_at=min(moment, now),
                    wire="anthropic" if model.startswith("claude") else "openai",
                    status="provider_error" if failed else "ok",
                    model_requested=model,
                    model_served=model,
                    http_status=500 if failed else 200,
                    stream=rng.random() < 0.7,
                    ttfb_ms=rng.randint(200, 1500),
                    total_ms=rng.randint(800, 30000),
                    gateway_ms=rng.randint(1, 8),
                    prompt_tokens=None if failed else rng.randint(2000, 90000),
                    cached_input_tokens=None if failed else rng.randint(0, 60000),
                    completion_tokens=None if failed else rng.randint(50, 3000),
                    cost_nano_usd=None if failed else rng.randint(10**6, 10**8),
                )
            )
            if len(batch) >= 10_000:
                Call.objects.bulk_create(batch)
                batch.clear()
    Call.objects.bulk_create(batch)
    load = time.perf_counter() - started
    staff = users[0]
    rows = []

    def timed(label: str, fn) -> None:
        for attempt in ("first", "next"):
            t0 = time.perf_counter()
            fn()
            rows.append((label, attempt, time.perf_counter() - t0))

    timed(
        "30 days per day by model",
        lambda: usage_over_time.usage_over_time(
            user=staff,
            since=now - datetime.timedelta(days=30),
            until=now,
            bucket="day",
            group_by="model",
        ),
    )
    timed(
        "24 hours per hour by session",
        lambda: usage_over_time.usage_over_time(
            user=staff,
            since=now - datetime.timedelta(days=1),
            until=now,
            bucket="hour",
            group_by="session",
        ),
    )
    timed(
        "30 days per day by model, Asia/Kolkata",
        lambda: usage_over_time.usage_over_time(
            user=staff,
            since=now - datetime.timedelta(days=30),
            until=now,
            bucket="day",
            group_by="model",
            tz=ZoneInfo("Asia/Kolkata"),
        ),
    )
    timed(
        "30 days per day by model, one user",
        lambda: usage_over_time.usage_over_time(
            user=users[3],
            since=now - datetime.timedelta(days=30),
            until=now,
            bucket="day",
            group_by="model",
        ),
    )
    timed("/metrics exposition", metrics.exposition)
    levels = ", ".join(f"{name} {n:,}" for name, n in call_rollup.level_counts().items())
    print(
        f"calls: {Call.objects.count():,} (loaded in {load:.0f} s); "
        f"rollup rows: {CallRollup.objects.count():,} ({levels})"
    )
    print("| read | | seconds |\n|---|---|---|")
    for label, attempt, seconds in rows:
        print(f"| {label} | {attempt} | {seconds:.3f} |")


if __name__ == "__main__":
    main()
