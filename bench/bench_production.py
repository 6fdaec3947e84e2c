"""Production hardening figures (issue 8): concurrent appends through two daphne processes, the
PostgreSQL connections they hold, and a Redis outage. Prints one markdown table.

    .venv/bin/python bench/bench_production.py                  # both profiles + the outage
    .venv/bin/python bench/bench_production.py --profile production --outage-seconds 20
    .venv/bin/python bench/bench_production.py --profile embedded

production: a throwaway `bench_production` database on 127.0.0.1:5432 and a private
redis-server on a spare port (the shared Redis on 6379 is never touched, let alone stopped),
two daphne processes and a separate Celery worker. embedded: two daphne processes on one
throwaway SQLite file (in-memory layer and broker in each; no worker needed for appends).
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import httpx
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from child_env import child_env  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"
DB_NAME = "bench_production"

Row = tuple[str, str, str]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_port(port: int, process: subprocess.Popen, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not start") from None
            time.sleep(0.2)


def _pg_admin(sql: str) -> None:
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(sql)


def manage(env: dict[str, str], *args: str) -> str:
    """`manage.py ARGS` in a child with `env`; its output, or RuntimeError with its stderr."""
    result = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if result.returncode != 0:
        raise RuntimeError(result.stderr)
    return result.stdout


class PrivateRedis:
    def __init__(self) -> None:
        self.port = _free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
            + ["--appendonly", "no"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        _wait_port(self.port, self.process, "redis-server")

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=10)
            self.process = None


class Stack:
    """Two daphne processes (and, in production, a Celery worker) on one database."""

    def __init__(self, env: dict[str, str], *, worker: bool) -> None:
        self.env = env
        self.processes: list[subprocess.Popen] = []
        self.ports: list[int] = []
        self.worker = worker
        # Read by tracebacks(), closed by close().
        self.log = tempfile.TemporaryFile()  # noqa: SIM115
        self.worker_log = tempfile.TemporaryFile()  # noqa: SIM115

    def manage(self, *args: str) -> str:
        return manage(self.env, *args)

    def start(self) -> None:
        for _ in range(2):
            port = _free_port()
            process = subprocess.Popen(
                [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port)]
                + ["config.asgi:application"],
                cwd=ROOT,
                env=self.env,
                stdout=subprocess.DEVNULL,
                stderr=self.log,
            )
            self.processes.append(process)
            _wait_port(port, process, "daphne")
            self.ports.append(port)
        if self.worker:
            self.processes.append(
                subprocess.Popen(
                    [sys.executable, "-m", "celery", "-A", "config", "worker", "-l", "warning"]
                    + ["--concurrency", "2"],
                    cwd=ROOT,
                    env=self.env,
                    stdout=subprocess.DEVNULL,
                    stderr=self.worker_log,
                )
            )

    def stop(self) -> None:
        for process in self.processes:
            process.terminate()
        for process in self.processes:
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()

    def close(self) -> None:
        self.log.close()
        self.worker_log.close()

    def tracebacks(self, *, worker: bool = False) -> int:
        """Tracebacks in the daphne processes' stderr (or the worker's); the text is appended
        to $BENCH_SERVER_LOG when set."""
        log = self.worker_log if worker else self.log
        log.seek(0)
        text = log.read().decode("utf-8", "replace")
        if os.environ.get("BENCH_SERVER_LOG"):
            with open(os.environ["BENCH_SERVER_LOG"], "a") as out:
                out.write(text)
        return text.count("Traceback")


def _token(stack: Stack) -> str:
    script = (
        "from django.contrib.auth import get_user_model; "
        "from rest_framework.authtoken.models import Token; "
        "u, _ = get_user_model().objects.get_or_create(username='bench'); "
        "print(Token.objects.get_or_create(user=u)[0].key)"
    )
    return stack.manage("shell", "-c", script).strip().splitlines()[-1]


def _session(base: str, token: str) -> str:
    response = httpx.post(
        f"{base}/api/v1/sessions",
        headers={"Authorization": f"Token {token}"},
        json={
            "model": "gpt-4.1",
            "contextLimit": 1_000_000,
            "settings": {"autoCompact": False, "refreshThresholdTokens": 10**9},
        },
        timeout=30,
    )
    response.raise_for_status()
    return response.json()["id"]


class PeakConnections(threading.Thread):
    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak = 0
        self.stopping = threading.Event()

    def run(self) -> None:
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            while not self.stopping.is_set():
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (DB_NAME,)
                ).fetchone()
                self.peak = max(self.peak, row[0] if row else 0)
                time.sleep(0.05)


def _writers(stack: Stack, token: str, *, writers: int, appends: int) -> dict[str, object]:
    bases = [f"http://127.0.0.1:{port}" for port in stack.ports]
    session_id = _session(bases[0], token)
    statuses: collections.Counter[int] = collections.Counter()
    errors: list[str] = []
    lock = threading.Lock()

    def writer(number: int) -> None:
        with httpx.Client(
            base_url=bases[number % len(bases)],
            headers={"Authorization": f"Token {token}"},
            timeout=60,
        ) as client:
            for n in range(appends):
                try:
                    response = client.post(
                        f"/api/v1/sessions/{session_id}/events",
                        json={"type": "USER_MESSAGE", "content": f"writer {number} append {n}"},
                    )
                    with lock:
                        statuses[response.status_code] += 1
                except httpx.HTTPError as exc:
                    with lock:
                        errors.append(repr(exc))

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(writers)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    return {"elapsed": elapsed, "statuses": statuses, "errors": errors, "session_id": session_id}


EVENTS_SQL = (
    "SELECT count(*), count(DISTINCT seq), coalesce(max(seq), 0) FROM sessions_app_event "
    "WHERE session_id = {}"
)


def _pg_events(session_id: str) -> tuple[int, int, int]:
    with psycopg.connect(f"postgresql://postgres@127.0.0.1:5432/{DB_NAME}") as conn:
        row = conn.execute(EVENTS_SQL.format("%s"), (session_id,)).fetchone()
    assert row is not None
    return row


def _sqlite_events(var_dir: Path, session_id: str) -> tuple[int, int, int]:
    import sqlite3

    with sqlite3.connect(var_dir / "db.sqlite3") as conn:
        # Django stores UUIDs in SQLite as 32 hex digits.
        row = conn.execute(EVENTS_SQL.format("?"), (uuid.UUID(session_id).hex,)).fetchone()
    return row


def _outage(stack: Stack, redis: PrivateRedis, token: str, *, seconds: float) -> list[Row]:
    """Four clients keep reading, appending and asking for compactions while Redis is down
    for `seconds`, then for 5 s after it is back."""
    bases = [f"http://127.0.0.1:{port}" for port in stack.ports]
    session_id = _session(bases[0], token)
    phase = ["down"]
    counts: dict[tuple[str, str], collections.Counter[int]] = collections.defaultdict(
        collections.Counter
    )
    acknowledged: list[str] = []
    errors: list[str] = []
    lock = threading.Lock()
    stop = threading.Event()
    slowest = [0.0]

    def client_loop(number: int) -> None:
        with httpx.Client(
            base_url=bases[number % 2], headers={"Authorization": f"Token {token}"}, timeout=60
        ) as client:
            turn = 0
            while not stop.is_set():
                turn += 1
                calls = [
                    ("read", "GET", f"/api/v1/sessions/{session_id}/usage", None),
                    (
                        "append",
                        "POST",
                        f"/api/v1/sessions/{session_id}/events",
                        {"id": str(uuid.uuid4()), "type": "USER_MESSAGE", "content": f"{turn}"},
                    ),
                ]
                if turn % 5 == 0:
                    calls.append(
                        (
                            "compaction",
                            "POST",
                            f"/api/v1/sessions/{session_id}/compactions",
                            {"strategy": "trim", "targetRatio": 0.5},
                        )
                    )
                for kind, method, path, body in calls:
                    at_start = phase[0]
                    started = time.perf_counter()
                    try:
                        response = client.request(method, path, json=body)
                    except httpx.HTTPError as exc:
                        with lock:
                            errors.append(repr(exc))
                        continue
                    took = time.perf_counter() - started
                    # A call that began before the restart and ended after it is counted apart.
                    current = at_start if phase[0] == at_start else "edge"
                    with lock:
                        slowest[0] = max(slowest[0], took)
                        counts[(current, kind)][response.status_code] += 1
                        if kind == "append" and response.status_code == 201:
                            acknowledged.append(body["id"])  # type: ignore[index]
                time.sleep(0.05)

    redis.stop()
    threads = [threading.Thread(target=client_loop, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    time.sleep(seconds)
    phase[0] = "back"
    redis.start()
    back_at = time.monotonic()
    time.sleep(5)
    stop.set()
    for thread in threads:
        thread.join()

    database = PG_ADMIN.rsplit("/", 1)[0] + f"/{DB_NAME}"
    # The worker reconnects on Celery's own back-off (2 s, 4 s, 6 s … between attempts), so
    # the runs accepted after the restart may still wait: measure when the last one finishes.
    drained = None
    deadline = time.monotonic() + 60
    with psycopg.connect(database, autocommit=True) as conn:
        while time.monotonic() < deadline:
            active = conn.execute(
                "SELECT count(*) FROM compaction_app_compactionrun WHERE session_id = %s "
                "AND status IN ('pending', 'running')",
                (session_id,),
            ).fetchone()
            if active and active[0] == 0:
                drained = time.monotonic() - back_at
                break
            time.sleep(0.2)

    with psycopg.connect(database) as conn:
        stored = {
            str(row[0])
            for row in conn.execute(
                "SELECT id FROM sessions_app_event WHERE session_id = %s", (session_id,)
            )
        }
        runs = conn.execute(
            "SELECT status, count(*) FROM compaction_app_compactionrun WHERE session_id = %s "
            "GROUP BY status",
            (session_id,),
        ).fetchall()
    lost = len(set(acknowledged) - stored)
    accepted = sum(counts[(p, "compaction")][202] for p in ("down", "edge", "back"))

    def show(counter: collections.Counter[int]) -> str:
        return ", ".join(f"{code}×{n}" for code, n in sorted(counter.items())) or "—"

    rows: list[Row] = []
    for current, label in (
        ("down", f"Redis down {seconds:.0f} s"),
        ("edge", "calls spanning the restart"),
        ("back", "5 s after"),
    ):
        for kind in ("read", "append", "compaction"):
            rows.append(
                ("production", f"outage: {label}, {kind} statuses", show(counts[(current, kind)]))
            )
    five_xx_other = sum(
        n
        for (current, kind), counter in counts.items()
        for code, n in counter.items()
        if code >= 500 and not (kind == "compaction" and code == 503 and current == "down")
    )
    rows += [
        ("production", "outage: acknowledged appends lost", f"{lost} of {len(acknowledged)}"),
        (
            "production",
            "outage: runs stored vs. 202s answered",
            f"{sum(n for _, n in runs)} stored ({', '.join(f'{s} {n}' for s, n in runs) or 'none'}) vs. {accepted}",
        ),
        ("production", "outage: 5xx other than the broker's 503", str(five_xx_other)),
        ("production", "outage: slowest call", f"{slowest[0]:.2f} s"),
        (
            "production",
            "outage: every accepted run finished, counted from Redis's return",
            f"{drained:.1f} s" if drained is not None else "not within 65 s",
        ),
        ("production", "outage: client errors (no HTTP answer)", str(len(errors))),
    ]
    return rows


def _append_rows(
    profile: str,
    result: dict[str, object],
    stored: tuple[int, int, int],
    writers: int,
    appends: int,
) -> list[Row]:
    statuses: collections.Counter[int] = result["statuses"]  # type: ignore[assignment]
    errors: list[str] = result["errors"]  # type: ignore[assignment]
    total = writers * appends
    elapsed: float = result["elapsed"]  # type: ignore[assignment]
    label = f"{writers} writers × {appends} appends over 2 daphne processes"
    return [
        (profile, f"{label}: throughput", f"{total / elapsed:.0f} appends/s ({elapsed:.1f} s)"),
        (
            profile,
            f"{label}: statuses",
            ", ".join(f"{code}×{n}" for code, n in sorted(statuses.items())),
        ),
        (profile, f"{label}: 5xx", str(sum(n for code, n in statuses.items() if code >= 500))),
        (profile, f"{label}: client errors", str(len(errors))),
        (
            profile,
            f"{label}: events stored",
            f"{stored[0]} of {total}; seq 1..{stored[2]}, "
            + ("gap-free" if stored[0] == stored[1] == stored[2] else "NOT gap-free"),
        ),
    ]


def bench_production(*, writers: int, appends: int, outage_seconds: float) -> list[Row]:
    _pg_admin(f"DROP DATABASE IF EXISTS {DB_NAME} WITH (FORCE)")
    _pg_admin(f"CREATE DATABASE {DB_NAME}")
    redis = PrivateRedis()
    redis.start()
    var_dir = Path(tempfile.mkdtemp(prefix="bench-production-"))
    env = child_env(var_dir=var_dir)
    env.update(
        DATABASE_URL=f"postgres://postgres@127.0.0.1:5432/{DB_NAME}",
        REDIS_URL=redis.url,
        DJANGO_SECRET_KEY="bench-not-secret",
        # Throttling stays on (it is what reads the cache), with a rate the bench never hits.
        API_THROTTLE_RATE="1000000/min",
        CHANNELS_PREFIX="bench-production",
        CELERY_QUEUE="bench-production",
    )
    stack = Stack(env, worker=True)
    rows: list[Row] = []
    try:
        stack.manage("migrate", "--noinput")
        token = _token(stack)
        stack.start()
        peak = PeakConnections()
        peak.start()
        result = _writers(stack, token, writers=writers, appends=appends)
        peak.stopping.set()
        peak.join()
        stored = _pg_events(str(result["session_id"]))
        rows += _append_rows("production", result, stored, writers, appends)
        pool = env.get("DB_POOL_MAX_SIZE", "10")
        rows.append(
            (
                "production",
                "peak PostgreSQL connections (pg_stat_activity, whole stack)",
                f"{peak.peak} (2 daphne + 1 worker of 2 processes, DB_POOL_MAX_SIZE={pool})",
            )
        )
        if outage_seconds > 0:
            rows += _outage(stack, redis, token, seconds=outage_seconds)
        stack.stop()
        rows.append(("production", "tracebacks in the daphne logs", str(stack.tracebacks())))
        rows.append(
            (
                "production",
                "tracebacks in the worker's log (Celery reporting the lost broker, then reconnecting)",
                str(stack.tracebacks(worker=True)),
            )
        )
    finally:
        stack.stop()
        stack.close()
        redis.stop()
        _pg_admin(f"DROP DATABASE IF EXISTS {DB_NAME} WITH (FORCE)")
        shutil.rmtree(var_dir, ignore_errors=True)
    return rows


def bench_embedded(*, writers: int, appends: int) -> list[Row]:
    var_dir = Path(tempfile.mkdtemp(prefix="bench-embedded-"))
    env = child_env(var_dir=var_dir)
    env["API_THROTTLE_RATE"] = "1000000/min"
    stack = Stack(env, worker=False)
    try:
        stack.manage("migrate", "--noinput")
        token = _token(stack)
        stack.start()
        result = _writers(stack, token, writers=writers, appends=appends)
        stored = _sqlite_events(var_dir, str(result["session_id"]))
        rows = _append_rows("embedded", result, stored, writers, appends)
        stack.stop()
        rows.append(("embedded", "tracebacks in the daphne logs", str(stack.tracebacks())))
    finally:
        stack.stop()
        stack.close()
        shutil.rmtree(var_dir, ignore_errors=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--profile", choices=["all", "production", "embedded"], default="all")
    parser.add_argument("--writers", type=int, default=8)
    parser.add_argument("--appends", type=int, default=200)
    parser.add_argument("--outage-seconds", type=float, default=20.0, help="0 skips the outage")
    args = parser.parse_args(argv)
    rows: list[Row] = []
    if args.profile in ("all", "embedded"):
        rows += bench_embedded(writers=args.writers, appends=args.appends)
    if args.profile in ("all", "production"):
        rows += bench_production(
            writers=args.writers, appends=args.appends, outage_seconds=args.outage_seconds
        )
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"cores: {os.cpu_count()}, load average: {load}\n")
    print("| profile | figure | value |")
    print("|---|---|---|")
    for profile, figure, value in rows:
        print(f"| {profile} | {figure} | {value} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
