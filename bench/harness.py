"""What the profile benchmarks (ledger, search, gateway) share: a child process per profile on a
throwaway database, its rows back over stdout, and one markdown table with the machine's load."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
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


def django_child(*, profile: str | None = None, pg_db: str | None = None) -> tuple[Any, str]:
    """The child's start: the repository and bench/ importable, Django set up on the database
    the parent prepared (with `profile`: only ever the throwaway `pg_db` or a temporary
    VAR_DIR, never the dev one), migrated, and a `bench` user; that user and its API token."""
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "bench"))
    os.chdir(ROOT)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    database_url = os.environ.get("DATABASE_URL", "")
    if profile == "postgres" and not database_url.endswith(f"/{pg_db}"):
        raise SystemExit(f"refusing to run: DATABASE_URL is not the {pg_db} bench database")
    if profile == "embedded" and (database_url or not os.environ.get("VAR_DIR")):
        raise SystemExit("refusing to run: the embedded bench needs a temporary VAR_DIR")
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from rest_framework.authtoken.models import Token

    call_command("migrate", verbosity=0, interactive=False)
    user = get_user_model().objects.create_user(username="bench", password="bench-password")
    return user, Token.objects.create(user=user).key


def api_session(client: Any, *, title: str) -> str:
    """A session created through the REST API by `client` (a Django test client with the
    bench token), clear of auto-compaction and refresh (Celery jobs that are not what is
    measured); its id."""
    response = client.post(
        "/api/v1/sessions",
        {
            "model": "gpt-4.1",
            "title": title,
            "settings": {"autoCompact": False, "refreshThresholdTokens": 100_000_000},
        },
        content_type="application/json",
    )
    assert response.status_code == 201, response.content[:300]
    return str(response.json()["id"])


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
        rows, failure = _child_answer(script, [profile, *args], env=env, timeout=timeout, cwd=cwd)
        return rows if failure is None else [row(profile, "benchmark run", failure, ok=False)]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if created_db:
            try:
                pg_admin(f"DROP DATABASE IF EXISTS {pg_db} WITH (FORCE)")
            except Exception as exc:  # leave a note, never hide the table
                sys.stderr.write(f"could not drop {pg_db}: {exc}\n")


def _child_answer(
    script: str,
    args: list[str],
    *,
    env: Mapping[str, str],
    timeout: float,
    cwd: Path = ROOT,
) -> tuple[Any, str | None]:
    """Run `script --child ARGS`; what it emitted after ROW_MARKER, or why there is nothing
    (its stderr goes to ours then)."""
    command = [sys.executable, str(Path(script).resolve()), "--child", *args]
    proc = subprocess.run(
        command, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout
    )
    for line in proc.stdout.splitlines():
        if line.startswith(ROW_MARKER):
            return json.loads(line[len(ROW_MARKER) :]), None
    sys.stderr.write(proc.stderr)
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
    return None, f"failed (exit {proc.returncode}): {tail[0]}"


def run_embedded_child(*, script: str, args: list[str], timeout: float) -> tuple[Any, str | None]:
    """`script --child ARGS` on the embedded profile in a temporary VAR_DIR, removed afterwards:
    the payload it emitted, or (None, why it failed)."""
    tmp = Path(tempfile.mkdtemp(prefix=f"{Path(script).stem}_"))
    try:
        return _child_answer(script, args, env=child_env(var_dir=tmp), timeout=timeout)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


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


def profile_main(
    argv: list[str] | None,
    *,
    title: str,
    description: str,
    script: str,
    pg_db: str,
    child: Callable[[str, int], list[Row]],
    option: str,
    default: int,
    help: str,
    timeout: float,
) -> int:
    """A profile benchmark's command line: `--profile embedded|postgres|both` and one whole
    number `option` for `child`. As the parent: `run_profiles`; as the child (`--child
    PROFILE`, started by `run_child`): `emit(child(PROFILE, value))`."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--profile", choices=["embedded", "postgres", "both"], default="both")
    parser.add_argument(option, type=int, default=default, help=help)
    parser.add_argument("--child", choices=["embedded", "postgres"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    value = getattr(args, option.lstrip("-").replace("-", "_"))
    if args.child:
        emit(child(args.child, value))
        return 0
    return run_profiles(
        title,
        profile=args.profile,
        script=script,
        args=[option, str(value)],
        pg_db=pg_db,
        timeout=timeout,
    )


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
