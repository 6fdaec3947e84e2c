"""Real `celery -A config worker` subprocesses on the test's database, for what only a separate
process shows (a worker killed mid-run, a worker riding out a Redis restart)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from compaction_app.testkit.celery_worker import start_celery_worker

ROOT = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT = 120  # a Celery worker starting Django on a loaded two-core machine


class Workers:
    """`celery -A config worker` subprocesses with the environment given; each in its own
    process group, which `stop_all` kills."""

    def __init__(self, *, tmp_path: Path, env: Mapping[str, str]) -> None:
        self.tmp_path = tmp_path
        self.env = dict(env)
        self.started: list[tuple[subprocess.Popen[bytes], Path]] = []

    def start(self, name: str, *extra: str) -> subprocess.Popen[bytes]:
        log_path = self.tmp_path / f"{name}.log"
        process = start_celery_worker(
            name=name, env=self.env, log_path=log_path, extra=("--pool", "prefork", *extra)
        )
        self.started.append((process, log_path))
        return process

    def log(self, name: str) -> str:
        return (self.tmp_path / f"{name}.log").read_text(errors="replace")

    def wait_ready(self, name: str, *, timeout: float = STARTUP_TIMEOUT) -> None:
        """Until the worker is consuming (so the test's timeouts measure recovery, not start-up)."""
        wait_for(
            lambda: "ready." in self.log(name),
            timeout=timeout,
            what=f"worker {name} to start",
            logs=self.logs,
        )

    def logs(self) -> str:
        return "\n".join(
            f"--- {path.name}\n{path.read_text(errors='replace')[-4000:]}"
            for _, path in self.started
        )

    def stop_all(self) -> None:
        for process, _ in self.started:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)


@contextlib.contextmanager
def worker_pool(
    *, settings: Any, tmp_path: Path, queue_suffix: str, env: Mapping[str, str]
) -> Iterator[Workers]:
    """Workers on this test's database and channel prefix, consuming a queue of their own
    (which this process sends to meanwhile): the in-process worker thread of other test
    modules consumes the default queue and must not take their tasks. `env` adds to or
    overrides the environment (Redis, the summarizer...)."""
    from django.db import connection

    from config.celery import app

    queue = f"{settings.CELERY_TASK_DEFAULT_QUEUE}-{queue_suffix}"
    default_queue = app.conf.task_default_queue
    app.conf.task_default_queue = queue
    database_url = (
        urlsplit(os.environ["DATABASE_URL"])
        ._replace(path="/" + connection.settings_dict["NAME"])
        .geturl()
    )
    pool = Workers(
        tmp_path=tmp_path,
        env={
            **os.environ,
            "DATABASE_URL": database_url,
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "PYTHONPATH": str(ROOT),
            "CELERY_QUEUE": queue,
            "CHANNELS_PREFIX": settings.CHANNEL_LAYERS["default"]["CONFIG"]["prefix"],
            **env,
        },
    )
    try:
        yield pool
    finally:
        pool.stop_all()
        app.conf.task_default_queue = default_queue


def wait_for(condition: Callable[[], Any], *, timeout: float, what: str, logs: Callable[[], str]):
    """`condition()`'s first truthy value, polled every 0.2 s; fails after `timeout` seconds
    with the workers' logs."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}\n{logs()}"
        time.sleep(0.2)
