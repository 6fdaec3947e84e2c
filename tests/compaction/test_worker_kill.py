"""kill -9 of a real `celery -A config worker` process in the middle of a compaction, on the
production profile (PostgreSQL + Redis): the sweeper, run by Celery beat in a second worker,
fails the orphaned run, the folded events stay untouched, and the session accepts a new
compaction. The summarizer is the `openai` one, pointed at a local provider stand-in that takes
a minute to answer, so the kill lands while the worker is summarizing."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

from compaction_app.testkit.provider_standin import ProviderStandIn, slow
from tests.support.celery_workers import STARTUP_TIMEOUT, Workers, wait_for, worker_pool
from tests.support.helpers import (
    all_events,
    coding_turns,
    grown_session,
    request_compaction,
    wait_for_run,
)

STALE_SECONDS = 3
SWEEP_SECONDS = 1

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        not (os.environ.get("DATABASE_URL") and os.environ.get("REDIS_URL")),
        reason="needs the production profile (DATABASE_URL and REDIS_URL)",
    ),
]


@pytest.fixture
def provider() -> Iterator[ProviderStandIn]:
    # Every summarizer call hangs for a minute (cut short when the server closes).
    with ProviderStandIn(default=slow(60.0)) as fake:
        yield fake


@pytest.fixture
def workers(transactional_db, settings, tmp_path, provider) -> Iterator[Workers]:
    env = {
        "COMPACTION_STALE_SECONDS": str(STALE_SECONDS),
        "COMPACTION_SWEEP_SECONDS": str(SWEEP_SECONDS),
        "OPENAI_BASE_URL": provider.openai_url,
        "OPENAI_API_KEY": "test-key",
        "SUMMARIZER_TIMEOUT_SECONDS": "120",
    }
    with worker_pool(settings=settings, tmp_path=tmp_path, queue_suffix="kill", env=env) as pool:
        yield pool


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
    wait_for(
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
    orphan = wait_for(
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
