"""Idempotent retries (issue 8): a bulk append of N events with client ids, its identical retry,
a retry with one new event, and a retry with one changed event (409). Prints one markdown table.

    .venv/bin/python bench/bench_idempotency.py [--events 3000] [--runs 3]

Runs in a child process on a throwaway SQLite database (embedded profile, see child_env.py);
the dev database is never touched. Figures are the median of --runs, each on a new session.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from child_env import child_env

ROOT = Path(__file__).resolve().parent.parent


def _child(events: int, runs: int) -> None:
    sys.path.insert(0, str(ROOT))
    os.chdir(ROOT)
    if os.environ.get("DATABASE_URL") or not os.environ.get("VAR_DIR"):
        raise SystemExit("refusing to run: the bench needs a temporary VAR_DIR")
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.test import Client
    from rest_framework.authtoken.models import Token

    call_command("migrate", verbosity=0, interactive=False)
    user = get_user_model().objects.create_user(username="bench", password="bench-password")
    client = Client(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")

    def post(url: str, body: object, expect: int) -> float:
        raw = json.dumps(body)
        start = time.perf_counter()
        response = client.post(url, data=raw, content_type="application/json")
        elapsed = time.perf_counter() - start
        assert response.status_code == expect, response.content[:300]
        return elapsed

    timings: dict[str, list[float]] = {}
    for _ in range(runs):
        session = client.post(
            "/api/v1/sessions",
            data=json.dumps({"model": "gpt-4.1", "settings": {"autoCompact": False}}),
            content_type="application/json",
        ).json()["id"]
        url = f"/api/v1/sessions/{session}/events"
        bulk = [
            {
                "id": str(uuid.uuid4()),
                "type": "USER_MESSAGE" if i % 2 else "AGENT_MESSAGE",
                "content": f"message {i}: " + "the quick brown fox jumps " * 8,
                "metadata": {"turn": i},
                **({"tokenUsage": {"totalTokens": 100 + i}} if i % 2 == 0 else {}),
            }
            for i in range(events)
        ]
        changed = [dict(item) for item in bulk]
        changed[-1]["content"] = "changed"
        cases = [
            ("first append (201)", bulk, 201),
            ("identical retry (200)", bulk, 200),
            ("retry + 1 new event (201)", [*bulk, {"type": "USER_MESSAGE", "content": "x"}], 201),
            ("retry, last event changed (409)", changed, 409),
        ]
        for name, body, expect in cases:
            timings.setdefault(name, []).append(post(url, body, expect))
    print(f"| request ({events} events) | median ms | events/s |")
    print("|---|---:|---:|")
    for name, values in timings.items():
        median = statistics.median(values)
        print(f"| {name} | {median * 1000:.0f} | {events / median:,.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=3000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.events, args.runs)
        return
    with tempfile.TemporaryDirectory(prefix="bench-idempotency-") as var_dir:
        subprocess.run(
            [
                sys.executable,
                __file__,
                "--child",
                "--events",
                str(args.events),
                "--runs",
                str(args.runs),
            ],
            env=child_env(var_dir=Path(var_dir)),
            check=True,
        )


if __name__ == "__main__":
    main()
