"""A real `celery -A config worker` process for the kill -9 test and benchmark: what only a
separate process shows (a worker dying mid-run, the sweeper failing its orphaned run)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def start_celery_worker(
    *, name: str, env: Mapping[str, str], log_path: Path, extra: tuple[str, ...] = ()
) -> subprocess.Popen[bytes]:
    """Start a one-process worker named `name@host`, logging to `log_path`, in a process
    group of its own (so `os.killpg` ends it and its pool child together). `extra`: more
    worker options (`--pool prefork`, `-B` for beat)."""
    command = [
        *("-m", "celery", "-A", "config", "worker", "--loglevel", "INFO"),
        *("--concurrency", "1", "--hostname", f"{name}@%h"),
        *("--without-mingle", "--without-gossip", *extra),
    ]
    with log_path.open("wb") as log:
        return subprocess.Popen(
            [sys.executable, *command],
            cwd=ROOT,
            env=dict(env),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
