"""A Redis restart while a real `celery -A config worker` (running beat too) holds an
unacknowledged compaction task, on the production profile: the worker rides it out
(config/redis_broker.py). The run it holds completes, and so does one requested after the
restart. A private redis-server on a spare port is restarted; the shared Redis is never
touched."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest

from compaction_app.testkit.provider_standin import ProviderStandIn, slow
from tests.support.celery_workers import Workers, wait_for, worker_pool
from tests.support.helpers import coding_turns, grown_session, request_compaction, wait_for_run
from tests.support.private_redis import PrivateRedis, running_private_redis, this_process_on

# The restart lands while the worker waits this long on the provider.
SUMMARIZER_SECONDS = 4.0
# Bounds of the test's phases (about 20 s in all when it passes).
STARTUP_SECONDS = 30
RECOVERY_SECONDS = 12

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        not (os.environ.get("DATABASE_URL") and os.environ.get("REDIS_URL")),
        reason="needs the production profile (DATABASE_URL and REDIS_URL)",
    ),
    pytest.mark.skipif(
        shutil.which("redis-server") is None, reason="redis-server is not installed"
    ),
]


@pytest.fixture
def provider() -> Iterator[ProviderStandIn]:
    with ProviderStandIn(default=slow(SUMMARIZER_SECONDS, "What happened so far.")) as fake:
        yield fake


@pytest.fixture
def broker(settings) -> Iterator[PrivateRedis]:
    with running_private_redis() as server, this_process_on(settings, server):
        yield server


@pytest.fixture
def workers(settings, tmp_path, provider, broker) -> Iterator[Workers]:
    env = {
        "REDIS_URL": broker.url,
        "OPENAI_BASE_URL": provider.openai_url,
        "OPENAI_API_KEY": "test-key",
    }
    with worker_pool(settings=settings, tmp_path=tmp_path, queue_suffix="restart", env=env) as pool:
        yield pool


@pytest.mark.timeout(STARTUP_SECONDS + 3 * RECOVERY_SECONDS)
def test_it_completes_queued_runs_when_redis_restarts_under_a_worker_holding_a_task(
    alice_api, provider, broker, workers, tmp_path
):
    session_id = grown_session(alice_api, events=coding_turns(count=12))
    # Two pool processes: with one busy, the worker keeps a receive pending on Redis, which is
    # what the restart used to turn into the worker's exit.
    schedule = str(tmp_path / "beat-schedule")
    worker = workers.start("survivor", "--concurrency", "2", "--beat", "--schedule", schedule)
    workers.wait_ready("survivor", timeout=STARTUP_SECONDS)
    held = request_compaction(alice_api, session_id=session_id, summarizer="openai")
    # The worker has taken the task (unacknowledged until it ends) and waits on the provider.
    wait_for(
        lambda: provider.requests,
        timeout=RECOVERY_SECONDS,
        what="the summarizer call",
        logs=workers.logs,
    )

    broker.restart()

    done = wait_for_run(alice_api, run_id=held["id"], timeout=RECOVERY_SECONDS)
    assert done["status"] == "completed", f"{done}\n{workers.logs()}"
    # Requested after the restart: the worker reconnected and still consumes.
    after = request_compaction(alice_api, session_id=session_id, summarizer="local")
    done = wait_for_run(alice_api, run_id=after["id"], timeout=RECOVERY_SECONDS)
    assert done["status"] == "completed", f"{done}\n{workers.logs()}"
    assert worker.poll() is None, workers.logs()
    assert "Unrecoverable error" not in workers.log("survivor"), workers.logs()
