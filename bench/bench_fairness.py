"""Fairness under heavy requests: user A fires 8 heavy requests at once (GET /context of a big
session, compaction dry runs), round after round, while user B does simple reads (GET /usage of
its own small session). B's read latency at rest, then under A's load with the per-user limit
off (HEAVY_REQUESTS_PER_USER=0, as before it existed) and on (the default, 2), with Python's
5 ms GIL switch interval and with the servers' 0.5 ms (GIL_SWITCH_INTERVAL_MS).

embedded: one daphne process on SQLite (the in-process count). postgres: two daphne processes
on a throwaway PostgreSQL database and a private redis-server on a spare port (the count in
Redis, shared by both). Bounded: about a minute per profile with the defaults.

    .venv/bin/python bench/bench_fairness.py --profile embedded
    .venv/bin/python bench/bench_fairness.py --profile postgres --events 1500
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_production import PrivateRedis, _free_port, _pg_admin, _wait_port, manage  # noqa: E402
from child_env import child_env  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
HEAVY_AT_ONCE = 8
# (HEAVY_REQUESTS_PER_USER, GIL_SWITCH_INTERVAL_MS, label): no limit and Python's 5 ms switch
# interval as before either existed, the limit alone, and the limit with today's interval.
PHASES = (
    ("0", "5", "limit off, GIL 5 ms (before)"),
    ("2", "5", "limit 2, GIL 5 ms"),
    ("2", "0.5", "limit 2, GIL 0.5 ms (now)"),
)


class Servers:
    def __init__(self, env: dict[str, str], *, processes: int) -> None:
        self.env = env
        self.count = processes
        self.processes: list[subprocess.Popen] = []
        self.bases: list[str] = []

    def manage(self, *args: str) -> str:
        return manage(self.env, *args)

    def start(self, **extra: str) -> None:
        env = {**self.env, **extra}
        for _ in range(self.count):
            port = _free_port()
            process = subprocess.Popen(
                [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port)]
                + ["config.asgi:application"],
                cwd=ROOT,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            self.processes.append(process)
            _wait_port(port, process, "daphne")
            self.bases.append(f"http://127.0.0.1:{port}")

    def stop(self) -> None:
        for process in self.processes:
            process.terminate()
        for process in self.processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
        self.processes, self.bases = [], []


def _tokens(servers: Servers) -> tuple[str, str]:
    script = (
        "from django.contrib.auth import get_user_model; "
        "from rest_framework.authtoken.models import Token; "
        "[print(Token.objects.get_or_create(user=get_user_model().objects.get_or_create("
        "username=name)[0])[0].key) for name in ('alice', 'bob')]"
    )
    alice, bob = servers.manage("shell", "-c", script).strip().splitlines()[-2:]
    return alice, bob


def _session(base: str, token: str, *, events: int) -> str:
    headers = {"Authorization": f"Token {token}"}
    created = httpx.post(
        f"{base}/api/v1/sessions",
        headers=headers,
        json={
            "model": "gpt-4.1",
            "contextLimit": 1_000_000,
            "settings": {"autoCompact": False, "refreshThresholdTokens": 10**9},
        },
        timeout=30,
    )
    created.raise_for_status()
    session_id = created.json()["id"]
    # Coding turns with sizeable tool results: about 1,300 tokens an event.
    result = "def handler(request):\n    return compute(request.payload, retries=3)\n" * 60
    batch: list[dict[str, object]] = []
    for number in range(events):
        if number % 2:
            batch.append({"type": "TOOL_RESULT", "toolCallId": f"c{number}", "content": result})
        else:
            batch.append(
                {
                    "type": "TOOL_CALL",
                    "name": "read_file",
                    "toolCallId": f"c{number + 1}",
                    "content": f'{{"path": "src/module_{number}.py"}}',
                }
            )
        if len(batch) == 500 or number == events - 1:
            httpx.post(
                f"{base}/api/v1/sessions/{session_id}/events",
                headers=headers,
                json=batch,
                timeout=300,
            ).raise_for_status()
            batch = []
    return session_id


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def _reads(base: str, token: str, session_id: str, *, until: threading.Event) -> list[float]:
    took: list[float] = []
    with httpx.Client(headers={"Authorization": f"Token {token}"}, timeout=60) as client:
        while not until.is_set():
            started = time.perf_counter()
            client.get(f"{base}/api/v1/sessions/{session_id}/usage").raise_for_status()
            took.append((time.perf_counter() - started) * 1000)
            time.sleep(0.05)
    return took


def _heavy_rounds(
    bases: list[str], token: str, session_id: str, *, until: threading.Event
) -> dict[int, int]:
    statuses: dict[int, int] = {}
    headers = {"Authorization": f"Token {token}"}

    def one(number: int) -> int:
        base = bases[number % len(bases)]
        url = f"{base}/api/v1/sessions/{session_id}"
        if number % 2:
            response = httpx.post(
                f"{url}/compactions", headers=headers, json={"dryRun": True}, timeout=300
            )
        else:
            response = httpx.get(f"{url}/context", headers=headers, timeout=300)
        return response.status_code

    with ThreadPoolExecutor(HEAVY_AT_ONCE) as pool:
        while not until.is_set():
            for code in pool.map(one, range(HEAVY_AT_ONCE)):
                statuses[code] = statuses.get(code, 0) + 1
            if statuses.get(429) and not until.is_set():
                time.sleep(1)  # what Retry-After asks
    return statuses


def _phase(
    servers: Servers,
    tokens: tuple[str, str],
    sessions: tuple[str, str],
    *,
    seconds: float,
    heavy: bool,
) -> tuple[list[float], dict[int, int]]:
    until = threading.Event()
    statuses: dict[int, int] = {}
    loader = None
    if heavy:

        def load() -> None:
            statuses.update(_heavy_rounds(servers.bases, tokens[0], sessions[0], until=until))

        loader = threading.Thread(target=load)
        loader.start()
        time.sleep(1)  # A's first round under way
    timer = threading.Timer(seconds, until.set)
    timer.start()
    took = _reads(servers.bases[-1], tokens[1], sessions[1], until=until)
    if loader is not None:
        loader.join()
    return took, statuses


def _warm(servers: Servers, tokens: tuple[str, str], sessions: tuple[str, str]) -> None:
    """A fresh process's first requests load what it needs (the token encodings, the URL
    conf, connections): done once per process before measuring, in both phases alike."""
    for base in servers.bases:
        for token, session_id, tail in (
            (tokens[0], sessions[0], "context"),
            (tokens[1], sessions[1], "usage"),
        ):
            httpx.get(
                f"{base}/api/v1/sessions/{session_id}/{tail}",
                headers={"Authorization": f"Token {token}"},
                timeout=300,
            ).raise_for_status()


def _line(label: str, took: list[float], statuses: dict[int, int]) -> str:
    codes = ", ".join(f"{count}× {code}" for code, count in sorted(statuses.items())) or "—"
    return (
        f"| {label} | {len(took)} | {statistics.median(took):.0f} | "
        f"{_percentile(took, 0.99):.0f} | {max(took):.0f} | {codes} |"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", choices=["embedded", "postgres"], default="embedded")
    parser.add_argument("--events", type=int, default=1500, help="events in A's session")
    parser.add_argument("--seconds", type=float, default=15, help="seconds per measured phase")
    args = parser.parse_args()

    started = time.perf_counter()
    var_dir = Path(tempfile.mkdtemp(prefix="bench_fairness_"))
    env = child_env(var_dir=var_dir)
    redis = None
    database = None
    processes = 1
    if args.profile == "postgres":
        database = f"bench_fairness_{uuid.uuid4().hex[:8]}"
        _pg_admin(f"CREATE DATABASE {database}")
        redis = PrivateRedis()
        redis.start()
        env.update(
            DATABASE_URL=f"postgres://postgres@127.0.0.1:5432/{database}",
            REDIS_URL=redis.url,
            DJANGO_SECRET_KEY="bench",
            CHANNELS_PREFIX="bench-fairness",
        )
        processes = 2
    servers = Servers(env, processes=processes)
    lines = []
    try:
        servers.manage("migrate", "-v", "0")
        tokens = _tokens(servers)
        servers.start()
        sessions = (
            _session(servers.bases[0], tokens[0], events=args.events),
            _session(servers.bases[0], tokens[1], events=4),
        )
        context_tokens = httpx.get(
            f"{servers.bases[0]}/api/v1/sessions/{sessions[0]}/usage",
            headers={"Authorization": f"Token {tokens[0]}"},
        ).json()["contextTokens"]
        _warm(servers, tokens, sessions)
        took, _ = _phase(servers, tokens, sessions, seconds=5, heavy=False)
        lines.append(_line("B alone", took, {}))
        for limit, switch, label in PHASES:
            servers.stop()
            servers.start(HEAVY_REQUESTS_PER_USER=limit, GIL_SWITCH_INTERVAL_MS=switch)
            _warm(servers, tokens, sessions)
            took, statuses = _phase(servers, tokens, sessions, seconds=args.seconds, heavy=True)
            lines.append(
                _line(f"B while A fires {HEAVY_AT_ONCE} heavy at once, {label}", took, statuses)
            )
    finally:
        servers.stop()
        if redis is not None:
            redis.stop()
        if database is not None:
            _pg_admin(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
        shutil.rmtree(var_dir, ignore_errors=True)
    print(
        f"bench_fairness — profile {args.profile}, {processes} daphne process(es), "
        f"{os.cpu_count()} cores, load average {', '.join(f'{x:.1f}' for x in os.getloadavg())}; "
        f"A's session {args.events} events, {context_tokens:,} context tokens; "
        f"total {time.perf_counter() - started:.0f} s\n"
    )
    print("| phase | B's reads | p50 ms | p99 ms | max ms | A's answers |")
    print("|---|---|---|---|---|---|")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
