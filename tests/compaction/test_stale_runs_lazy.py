"""Lazy recovery of runs that lost their worker: without beat (or the embedded timer), a
request that finds the session's run stale fails it on the spot instead of answering 409."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from compaction_app.models import CompactionRun
from tests.support.helpers import (
    append_events,
    coding_turns,
    grown_session,
    request_compaction,
    wait_for_run,
)

pytestmark = pytest.mark.django_db(transaction=True)


def _dead_worker_run(session_id: str, *, age: float) -> CompactionRun:
    beat = timezone.now() - timedelta(seconds=age)
    return CompactionRun.objects.create(
        session_id=session_id,
        strategy="summarize",
        summarizer="local",
        trigger="manual",
        status="running",
        started_at=beat,
        attempts=1,
        heartbeat_at=beat,
    )


def test_it_fails_a_stale_run_when_a_compaction_is_requested(worker, alice_api, settings):
    settings.COMPACTION_STALE_SECONDS = 300.0
    session_id = grown_session(alice_api, events=coding_turns(count=12))
    dead = _dead_worker_run(session_id, age=301)
    run = request_compaction(alice_api, session_id=session_id)
    assert wait_for_run(alice_api, run_id=run["id"])["status"] == "completed"
    dead.refresh_from_db()
    assert dead.status == "failed" and "no heartbeat" in dead.error


def test_it_leaves_a_live_run_alone(alice_api, settings):
    settings.COMPACTION_STALE_SECONDS = 300.0
    session_id = grown_session(alice_api, events=coding_turns(count=12))
    alive = _dead_worker_run(session_id, age=10)
    response = alice_api.post(f"/api/v1/sessions/{session_id}/compactions", {}, format="json")
    assert response.status_code == 409
    alive.refresh_from_db()
    assert alive.status == "running"


def test_it_compacts_at_the_hard_limit_past_a_stale_run(worker, alice_api, settings):
    settings.COMPACTION_STALE_SECONDS = 300.0
    session_id = grown_session(alice_api, events=coding_turns(count=15))
    dead = _dead_worker_run(session_id, age=400)
    response = alice_api.post(f"/api/v1/sessions/{session_id}/context")
    assert response.status_code == 200, response.json()
    assert response.json()["compaction"]["status"] == "completed"
    dead.refresh_from_db()
    assert dead.status == "failed"


def test_it_starts_an_auto_compaction_past_a_stale_run(worker, alice_api, settings):
    settings.COMPACTION_STALE_SECONDS = 300.0
    session_id = grown_session(alice_api, events=coding_turns(count=2), autoCompact=True)
    dead = _dead_worker_run(session_id, age=400)
    append_events(alice_api, session_id=session_id, events=coding_turns(count=14, start=2))
    dead.refresh_from_db()
    assert dead.status == "failed"
    auto = CompactionRun.objects.filter(session_id=session_id, trigger="auto")
    assert auto.count() == 1
    assert wait_for_run(alice_api, run_id=str(auto.get().pk))["status"] == "completed"
