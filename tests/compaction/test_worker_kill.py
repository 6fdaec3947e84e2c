"""kill -9 of a real `celery -A config worker` process in the middle of a compaction, on the
production profile (PostgreSQL + Redis): the sweeper, run by Celery beat in a second worker,
fails the orphaned run, the folded events stay untouched, and the session accepts a new
compaction. The summarizer is the `openai` one, pointed at a local provider stand-in that takes
a minute to answer, so the kill lands while the worker is summarizing."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from compaction_app.testkit.celery_worker import start_celery_worker
from compaction_app.testkit.provider_standin import ProviderStandIn, slow
from tests.support.helpers import (
    all_events,
    coding_turns,
    grown_session,
    request_compaction,
    wait_for_run,
)

ROOT = Path(__file__).resolve().parents[2]
STALE_SECONDS = 3
SWEEP_SECONDS = 1
STARTUP_TIMEOUT = 120  # a Celery worker starting Django on a loaded two-core machine

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        not (os.environ.get("DATABASE_URL") and os.environ.get("REDIS_URL")),
        reason="needs the production profile (DATABASE_URL and REDIS_URL)",
    ),
]


class Workers:
    """`celery -A config worker` subprocesses on this test's database, queue and channel
    prefix; each in its own process group, which teardown kills."""

    def __init__(self, *, tmp_path: Path, env: dict[str, str]) -> None:
        self.tmp_path = tmp_path
        self.env = env
        self.started: list[tuple[subprocess.Popen[bytes], Path]] = []

    def start(self, name: str, *extra: str) -> subprocess.Popen[bytes]:
        log_path = self.tmp_path / f"{name}.log"
        process = start_celery_worker(
            name=name, env=self.env, log_path=log_path, extra=("--pool", "prefork", *extra)
        )
        self.started.append((process, log_path))
        return process

    def wait_ready(self, name: str) -> None:
        """Until the worker is consuming (so the test's timeouts measure recovery, not start-up)."""
        log_path = self.tmp_path / f"{name}.log"
        _wait_for(
            lambda: "ready." in log_path.read_text(errors="replace"),
            timeout=STARTUP_TIMEOUT,
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


@pytest.fixture
def provider() -> Iterator[ProviderStandIn]:
    # Every summarizer call hangs for a minute (cut short when the server closes).
    with ProviderStandIn(default=slow(60.0)) as fake:
        yield fake


@pytest.fixture
def workers(transactional_db, settings, tmp_path, provider) -> Iterator[Workers]:
    from django.db import connection

    from config.celery import app

    # A queue of their own: the session's in-process worker thread (other test modules'
    # `worker` fixture) consumes the default queue and must not take these tasks.
    queue = f"{settings.CELERY_TASK_DEFAULT_QUEUE}-kill"
    default_queue = app.conf.task_default_queue
    app.conf.task_default_queue = queue
    # The subprocesses must use the database this test runs on, and this process's channel
    # prefix (it carries a per-process suffix under pytest).
    database_url = (
        urlsplit(os.environ["DATABASE_URL"])
        ._replace(path="/" + connection.settings_dict["NAME"])
        .geturl()
    )
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "PYTHONPATH": str(ROOT),
        "CELERY_QUEUE": queue,
        "CHANNELS_PREFIX": settings.CHANNEL_LAYERS["default"]["CONFIG"]["prefix"],
        "COMPACTION_STALE_SECONDS": str(STALE_SECONDS),
        "COMPACTION_SWEEP_SECONDS": str(SWEEP_SECONDS),
        "OPENAI_BASE_URL": provider.openai_url,
        "OPENAI_API_KEY": "test-key",
        "SUMMARIZER_TIMEOUT_SECONDS": "120",
    }
    pool = Workers(tmp_path=tmp_path, env=env)
    try:
        yield pool
    finally:
        pool.stop_all()
        app.conf.task_default_queue = default_queue


def _wait_for(condition: Callable[[], Any], *, timeout: float, what: str, logs: Callable[[], str]):
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}\n{logs()}"
        time.sleep(0.2)


def test_it_frees_the_session_after_kill_9_of_the_worker_mid_run(
    alice_api, workers, provider, tmp_path
):
    session_id = grown_session(alice_api, events=coding_turns(count=12))
    before = all_events(alice_api, session_id=session_id)
    victim = workers.start("victim")
    workers.wait_ready("victim")
    run = request_compaction(alice_api, session_id=session_id, summarizer="openai")
    run_url = f"/api/v1/compactions/{run['id']}"

    # The victim has picked the task up and is waiting on the provider.
    _wait_for(
        lambda: provider.requests,
        timeout=STARTUP_TIMEOUT,
        what="the summarizer call",
        logs=lambda: f"{alice_api.get(run_url).json()}\n{workers.logs()}",
    )
    assert alice_api.get(f"/api/v1/compactions/{run['id']}").json()["status"] == "running"

    os.kill(victim.pid, signal.SIGKILL)  # the main process; its pool child dies with it
    victim.wait(timeout=30)
    busy = alice_api.post(f"/api/v1/sessions/{session_id}/compactions", {}, format="json")
    assert busy.status_code == 409  # orphaned: nothing else would ever finish this run

    # A fresh worker running Celery beat (-B), which schedules the stale-run sweep.
    workers.start("rescuer", "--beat", "--schedule", str(tmp_path / "beat-schedule"))
    orphan = _wait_for(
        lambda: (
            found
            if (found := alice_api.get(f"/api/v1/compactions/{run['id']}").json())["status"]
            == "failed"
            else None
        ),
        timeout=STARTUP_TIMEOUT,
        what="the sweeper to fail the orphaned run",
        logs=workers.logs,
    )
    assert "no heartbeat" in orphan["error"]
    assert orphan["tokensAfter"] is None
    # Nothing of the killed run was applied: the same events, none folded, no summary.
    assert all_events(alice_api, session_id=session_id) == before
    assert alice_api.get(f"/api/v1/sessions/{session_id}/summary").status_code == 404
    usage = alice_api.get(f"/api/v1/sessions/{session_id}/usage").json()
    assert usage["lastCompaction"]["id"] == run["id"]
    assert usage["lastCompaction"]["status"] == "failed"

    # The session accepts a new compaction, which the rescuer runs to completion.
    fresh = request_compaction(alice_api, session_id=session_id, summarizer="local")
    done = wait_for_run(alice_api, run_id=fresh["id"], timeout=STARTUP_TIMEOUT)
    assert done["status"] == "completed", f"{done['error']}\n{workers.logs()}"
    assert done["tokensAfter"] < done["tokensBefore"]
    # The killed run's task, redelivered by Redis after the visibility timeout, changed
    # nothing: still failed, and its provider was called once.
    assert alice_api.get(f"/api/v1/compactions/{run['id']}").json()["status"] == "failed"
    assert len(provider.requests) == 1
