"""What the profile benchmarks (ledger, search, gateway) share: a child process per profile on a
throwaway database, its rows back over stdout, and one markdown table with the machine's load."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from child_env import child_env

ROOT = Path(__file__).resolve().parent.parent
ROW_MARKER = "BENCH_ROWS "
PG_ADMIN_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"

Row = dict[str, Any]


def row(profile: str, figure: str, value: str, target: str = "—", ok: bool | None = None) -> Row:
    return {"profile": profile, "figure": figure, "value": value, "target": target, "ok": ok}


def emit(rows: list[Row]) -> None:
    """The child's answer to `run_child`."""
    print(ROW_MARKER + json.dumps(rows), flush=True)


def pg_admin(sql: str) -> None:
    import psycopg

    with psycopg.connect(PG_ADMIN_DSN, autocommit=True, connect_timeout=5) as conn:
        conn.execute(sql)


def run_child(
    *,
    script: str,
    profile: str,
    args: list[str],
    pg_db: str,
    timeout: float,
    postgres_env: Mapping[str, str] | None = None,
    root: Path | None = None,
) -> list[Row]:
    """Run `script --child PROFILE ARGS` in the environment of `child_env` (the embedded profile
    in a temporary VAR_DIR; postgres: a fresh database `pg_db`, dropped afterwards, plus
    `postgres_env`) and return the rows it emitted, or one failed row saying why.

    `root` runs the child against another checkout of the project (say a git worktree of an
    older commit, to measure what a change replaced): its directory is the child's working
    directory and comes first on PYTHONPATH, so its code wins over the installed one. The
    child must put it first on sys.path itself too (the script's own folder comes first)."""
    tmp = Path(tempfile.mkdtemp(prefix=f"{Path(script).stem}_{profile}_"))
    env = child_env(var_dir=tmp)  # VAR_DIR is harmless for postgres: nothing of var/ is used
    created_db = False
    try:
        if profile == "postgres":
            try:
                pg_admin(f"DROP DATABASE IF EXISTS {pg_db} WITH (FORCE)")
                pg_admin(f"CREATE DATABASE {pg_db}")
                created_db = True
            except Exception as exc:
                return [
                    row(profile, "PostgreSQL at 127.0.0.1:5432", f"unavailable: {exc}", ok=False)
                ]
            env["DATABASE_URL"] = f"postgres://postgres@127.0.0.1:5432/{pg_db}"
            env["DJANGO_SECRET_KEY"] = "bench"
            env.update(postgres_env or {})
        cwd = ROOT
        if root is not None:
            cwd = Path(root).resolve()
            env["PYTHONPATH"] = os.pathsep.join(
                [str(cwd), *filter(None, [env.get("PYTHONPATH", "")])]
            )
        command = [sys.executable, str(Path(script).resolve()), "--child", profile, *args]
        proc = subprocess.run(
            command, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout
        )
        for line in proc.stdout.splitlines():
            if line.startswith(ROW_MARKER):
                return json.loads(line[len(ROW_MARKER) :])
        sys.stderr.write(proc.stderr)
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        return [
            row(profile, "benchmark run", f"failed (exit {proc.returncode}): {tail[0]}", ok=False)
        ]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if created_db:
            try:
                pg_admin(f"DROP DATABASE IF EXISTS {pg_db} WITH (FORCE)")
            except Exception as exc:  # leave a note, never hide the table
                sys.stderr.write(f"could not drop {pg_db}: {exc}\n")


def markdown_table(rows: list[Row]) -> str:
    lines = ["| profile | figure | value | target | ok |", "|---|---|---|---|---|"]
    for r in rows:
        ok = "" if r["ok"] is None else ("✅" if r["ok"] else "❌")
        cells = [
            str(r[k]).replace("|", "\\|").replace("\n", " ")
            for k in ("profile", "figure", "value", "target")
        ]
        lines.append("| " + " | ".join([*cells, ok]) + " |")
    return "\n".join(lines)


def load_average() -> str:
    return ", ".join(f"{x:.1f}" for x in os.getloadavg())


def run_profiles(
    title: str,
    *,
    profile: str,
    script: str,
    args: list[str],
    pg_db: str,
    timeout: float,
    postgres_env: Mapping[str, str] | None = None,
) -> int:
    """A benchmark's parent: `run_child` for each profile chosen (`both`: embedded, then
    postgres), then `report` on all their rows."""
    profiles = ["embedded", "postgres"] if profile == "both" else [profile]
    load_before = load_average()
    started = time.perf_counter()
    rows: list[Row] = []
    for name in profiles:
        rows += run_child(
            script=script,
            profile=name,
            args=args,
            pg_db=pg_db,
            timeout=timeout,
            postgres_env=postgres_env,
        )
    return report(title, rows, started=started, load_before=load_before)


def report(title: str, rows: list[Row], *, started: float, load_before: str) -> int:
    """Print the table under a line naming the machine and its load (timings on a shared
    machine are only comparable with the load they ran under); exit status 1 when a row
    failed its target."""
    print(
        f"{title} — {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M UTC}, {os.cpu_count()} cores "
        f"({platform.processor() or platform.machine()}), load average {load_average()} "
        f"(before: {load_before}), Python {platform.python_version()}, "
        f"total {time.perf_counter() - started:.0f} s\n"
    )
    print(markdown_table(rows))
    return 0 if all(r["ok"] is not False for r in rows) else 1
