"""Recovery after kill -9 of a Celery worker's main process mid-compaction (issue 8, point 3).
Prints one markdown table.

    .venv/bin/python bench/bench_worker_kill.py [--configs 120:30,10:2]

Production profile: a throwaway `bench_worker_kill` database on the local PostgreSQL
(127.0.0.1:5432, user postgres) and the local Redis (127.0.0.1:6379/0), on a queue of its own.
For each `stale:sweep` configuration (COMPACTION_STALE_SECONDS:COMPACTION_SWEEP_SECONDS):

1. a "victim" `celery -A config worker` starts a summarize run whose `openai` summarizer calls a
   local provider stand-in (tests/provider_standin.py) that never answers in time;
2. a second worker running Celery beat (`-B`, the sweeper's schedule) is up, as in production;
3. the victim's main process gets SIGKILL (its pool child dies with it);
4. the clock runs from the kill until the run is `failed` and until the session accepts a new
   compaction (`compaction_request` no longer raises 409), then that run is awaited.

The bound is COMPACTION_STALE_SECONDS + COMPACTION_SWEEP_SECONDS: the last beat came at most a
quarter window before the kill, so the run turns stale at most one window after it, and the next
sweep comes at most one sweep interval later.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from harness import pg_admin

ROOT = Path(__file__).resolve().parent.parent
PG_DB = "bench_worker_kill"
REDIS_URL = "redis://127.0.0.1:6379/0"


def _wait(condition: Any, *, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.05)


def _child(stale: float, sweep: float, tmp: Path) -> dict[str, Any]:
    """One configuration, in a child process (Django reads its settings once per process)."""
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.contrib.auth import get_user_model

    from compaction_app.models import CompactionRun
    from compaction_app.services import compaction_request
    from compaction_app.testkit.celery_worker import start_celery_worker
    from compaction_app.testkit.provider_standin import ProviderStandIn, slow
    from sessions_app import services
    from sessions_app.errors import Conflict
    from sessions_app.models import Event, EventType, Session
    from sessions_app.services import EventInput

    owner = get_user_model().objects.create_user(username=f"bench-{os.getpid()}")
    session = services.session_create(
        owner=owner, model="gpt-4o", context_limit=8000, settings={"autoCompact": False}
    )
    events = []
    for turn in range(12):
        events += [
            EventInput(type=EventType.USER_MESSAGE, content=f"Please fix bug {turn}."),
            EventInput(type=EventType.AGENT_MESSAGE, content=f"Fixed bug {turn}: " + "x " * 80),
        ]
    services.event_append(session=session, events=events)

    def folded() -> list[Any]:
        return list(
            Event.objects.filter(session=session).order_by("seq").values_list("compacted_by_id")
        )

    before = folded()
    procs: list[subprocess.Popen] = []
    with ProviderStandIn(default=slow(600.0)) as fake:
        env = {**os.environ, "OPENAI_BASE_URL": fake.openai_url, "OPENAI_API_KEY": "k"}
        try:
            victim = start_celery_worker(name="victim", env=env, log_path=tmp / "victim.log")
            procs.append(victim)
            run = compaction_request(session=session, user=None, summarizer="openai")
            _wait(lambda: fake.requests, timeout=120, what="the victim's summarizer call")
            beat = ("-B", "-s", str(tmp / "beat"))
            procs.append(
                start_celery_worker(
                    name="rescuer", env=env, log_path=tmp / "rescuer.log", extra=beat
                )
            )
            _wait(
                lambda: "ready." in (tmp / "rescuer.log").read_text(errors="replace"),
                timeout=120,
                what="the rescuer",
            )
            killed = time.monotonic()
            os.kill(victim.pid, signal.SIGKILL)
            _wait(
                lambda: CompactionRun.objects.get(pk=run.pk).status == "failed",
                timeout=stale + sweep + 120,
                what="the sweeper",
            )
            failed_after = time.monotonic() - killed
            untouched = folded() == before
            while True:
                try:
                    fresh = compaction_request(
                        session=Session.objects.get(pk=session.pk), user=None, summarizer="local"
                    )
                    break
                except Conflict:
                    time.sleep(0.05)
            accepted_after = time.monotonic() - killed
            _wait(
                lambda: CompactionRun.objects.get(pk=fresh.pk).status in ("completed", "failed"),
                timeout=120,
                what="the new run",
            )
            status = CompactionRun.objects.get(pk=fresh.pk).status
        finally:
            for proc in procs:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
    return {
        "failed_after": failed_after,
        "accepted_after": accepted_after,
        "untouched": untouched,
        "new_run": status,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default="120:30,10:2", help="stale:sweep pairs, seconds")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        import json
        import tempfile

        stale, sweep = (float(x) for x in args.child.split(":"))
        with tempfile.TemporaryDirectory() as tmp:
            print("BENCH_ROW " + json.dumps(_child(stale, sweep, Path(tmp))))
        return

    import json

    rows = []
    for config in args.configs.split(","):
        stale, sweep = (float(x) for x in config.split(":"))
        pg_admin(f"DROP DATABASE IF EXISTS {PG_DB} WITH (FORCE)")
        pg_admin(f"CREATE DATABASE {PG_DB}")
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "DATABASE_URL": f"postgres://postgres@127.0.0.1:5432/{PG_DB}",
            "REDIS_URL": REDIS_URL,
            "DJANGO_SECRET_KEY": os.environ.get("DJANGO_SECRET_KEY", "bench"),
            "CELERY_QUEUE": f"bench-worker-kill-{os.getpid()}",
            "CHANNELS_PREFIX": f"bench-worker-kill-{os.getpid()}",
            "COMPACTION_STALE_SECONDS": str(stale),
            "COMPACTION_SWEEP_SECONDS": str(sweep),
            "DJANGO_LOG_LEVEL": "WARNING",
            "PYTHONPATH": str(ROOT),
        }
        try:
            subprocess.run(
                [sys.executable, "manage.py", "migrate", "--verbosity", "0"],
                cwd=ROOT,
                env=env,
                check=True,
            )
            out = subprocess.run(
                [sys.executable, __file__, "--child", config],
                cwd=ROOT,
                env=env,
                check=True,
                capture_output=True,
                text=True,
            ).stdout
        finally:
            pg_admin(f"DROP DATABASE IF EXISTS {PG_DB} WITH (FORCE)")
        result = json.loads(out.split("BENCH_ROW ", 1)[1])
        rows.append((stale, sweep, result))

    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"{os.cpu_count()} cores, load {load}, {platform.python_version()}\n")
    print(
        "| COMPACTION_STALE_SECONDS | COMPACTION_SWEEP_SECONDS | kill -9 → run failed "
        "| kill -9 → new compaction accepted | bound (stale + sweep) | folded events "
        "untouched | new run |"
    )
    print("|---:|---:|---:|---:|---:|---|---|")
    for stale, sweep, r in rows:
        bound = stale + sweep
        print(
            f"| {stale:g} s | {sweep:g} s | {r['failed_after']:.1f} s | {r['accepted_after']:.1f} s "
            f"| {bound:g} s | {'yes' if r['untouched'] else 'NO'} | {r['new_run']} |"
        )


if __name__ == "__main__":
    main()
