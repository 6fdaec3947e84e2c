"""Runs that lost their worker: the heartbeat, the sweeper (Celery task, embedded timer thread),
the admin action and `manage.py clear_stale_runs`. The kill -9 of a real worker process is in
tests/compaction/test_worker_kill.py."""

from __future__ import annotations

import io
import time
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.contrib.auth.models import Permission
from django.core.management import CommandError, call_command
from django.test import Client
from django.utils import timezone

from compaction_app.models import CompactionRun
from compaction_app.services import compaction_execute
from compaction_app.sweeper import MAX_REQUEUES, start_embedded_sweeper, sweep_stale_runs
from compaction_app.tasks import sweep_stale_compactions
from compaction_app.testkit.provider_standin import slow
from config.celery import app
from tests.support.helpers import (
    all_events,
    api_token,
    coding_turns,
    compact_and_wait,
    fake_openai,
    grown_session,
    receive_until,
    request_compaction,
    wait_for_run,
    ws_communicator,
)

pytestmark = pytest.mark.django_db(transaction=True)


def _orphan(session_id: str, *, status: str, age: float, **fields) -> CompactionRun:
    """A run as a lost worker or a lost task leaves it: active, last heard of `age` s ago."""
    beat = timezone.now() - timedelta(seconds=age)
    extra = {"started_at": beat, "attempts": 1} if status == "running" else {}
    return CompactionRun.objects.create(
        session_id=session_id,
        strategy="summarize",
        summarizer="local",
        trigger="manual",
        status=status,
        heartbeat_at=beat,
        **{**extra, **fields},
    )


def _wait_until(condition, *, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


@pytest.fixture
def stale_after_one_second(settings):
    settings.COMPACTION_STALE_SECONDS = 1.0
    return settings


# --- the embedded profile's timer -------------------------------------------------------------


def test_it_requeues_a_pending_run_whose_task_was_lost_from_the_embedded_timer(
    worker, alice_api, settings
):
    settings.COMPACTION_STALE_SECONDS = 5.0
    session_id = grown_session(alice_api, events=coding_turns(count=12))
    # A run whose task died with the in-memory broker of another process (an import, a
    # restarted server): nothing will ever deliver it.
    lost = _orphan(session_id, status="pending", age=10)
    busy = alice_api.post(f"/api/v1/sessions/{session_id}/compactions", {}, format="json")
    assert busy.status_code == 409

    sweeper = start_embedded_sweeper(interval=0.2)
    try:
        run = wait_for_run(alice_api, run_id=str(lost.pk))
    finally:
        sweeper.stop()
    assert run["status"] == "completed"
    assert CompactionRun.objects.get(pk=lost.pk).requeues >= 1
    assert compact_and_wait(alice_api, session_id=session_id)["status"] == "completed"


def test_it_keeps_a_slow_run_alive_with_its_heartbeat(worker, alice_api, settings):
    # The provider takes two stale windows to answer; the run's heartbeat must keep the
    # sweeper (sweeping five times a second) away from it. The window is wide enough for a
    # loaded test machine: beats come every 0.75 s.
    settings.COMPACTION_STALE_SECONDS = 3.0
    with fake_openai(settings, default=slow(6.0, text="## Status\nslow but fine")):
        session_id = grown_session(alice_api, events=coding_turns(count=12))
        sweeper = start_embedded_sweeper(interval=0.2)
        try:
            requested = request_compaction(alice_api, session_id=session_id, summarizer="openai")

            def beating_while_running() -> bool:
                run = CompactionRun.objects.get(pk=requested["id"])
                assert run.status in ("pending", "running"), run.error
                return run.started_at is not None and run.heartbeat_at > (
                    run.started_at + timedelta(seconds=4)
                )

            _wait_until(beating_while_running)
            run = wait_for_run(alice_api, run_id=requested["id"])
        finally:
            sweeper.stop()
    assert run["status"] == "completed", run["error"]


# --- the sweep itself (the Celery beat task in production) ------------------------------------


def test_it_fails_a_running_run_whose_heartbeat_stopped(
    worker, alice, alice_api, stale_after_one_second
):
    session_id = grown_session(alice_api, events=coding_turns(count=12))
    before = all_events(alice_api, session_id=session_id)
    dead = _orphan(session_id, status="running", age=30)
    token = api_token(alice)

    async def scenario():
        communicator = ws_communicator(f"/ws/sessions/{session_id}/", token=token)
        connected, _ = await communicator.connect()
        assert connected
        await sync_to_async(sweep_stale_compactions.delay)()
        complete = await receive_until(communicator, wanted="COMPACTION_COMPLETE")
        await communicator.disconnect()
        return complete

    complete = async_to_sync(scenario)()
    assert complete["compactionId"] == str(dead.pk)
    assert complete["success"] is False
    assert "no heartbeat" in complete["error"]
    run = alice_api.get(f"/api/v1/compactions/{dead.pk}").json()
    assert run["status"] == "failed" and run["finishedAt"]
    usage = alice_api.get(f"/api/v1/sessions/{session_id}/usage").json()
    assert usage["lastCompaction"]["id"] == str(dead.pk)
    assert usage["lastCompaction"]["status"] == "failed"
    assert all_events(alice_api, session_id=session_id) == before
    assert compact_and_wait(alice_api, session_id=session_id)["status"] == "completed"


def test_it_fails_a_pending_run_whose_task_was_lost_too_often(alice_api, stale_after_one_second):
    session_id = grown_session(alice_api, events=coding_turns(count=3))
    lost = _orphan(session_id, status="pending", age=5, requeues=MAX_REQUEUES)
    result = sweep_stale_runs()
    assert result.failed == [str(lost.pk)] and result.requeued == []
    run = alice_api.get(f"/api/v1/compactions/{lost.pk}").json()
    assert run["status"] == "failed"
    assert f"lost {MAX_REQUEUES + 1} times" in run["error"]
    request_compaction(alice_api, session_id=session_id)


def test_it_leaves_runs_with_a_recent_heartbeat_alone(alice_api, settings, worker):
    # `worker`: the requeued run's task must be drained before the tables are truncated (the
    # shared worker thread picks it up, and its row lock deadlocked the flush).
    settings.COMPACTION_STALE_SECONDS = 60.0
    running_id = grown_session(alice_api, events=coding_turns(count=3))
    pending_id = grown_session(alice_api, events=coding_turns(count=3))
    running = _orphan(running_id, status="running", age=1)
    pending = _orphan(pending_id, status="pending", age=1)
    assert sweep_stale_runs().failed == [] == sweep_stale_runs().requeued
    assert CompactionRun.objects.get(pk=running.pk).status == "running"
    assert CompactionRun.objects.get(pk=pending.pk).status == "pending"
    # The same runs an hour later are stale.
    later = timezone.now() + timedelta(hours=1)
    result = sweep_stale_runs(now=later)
    assert result.failed == [str(running.pk)] and result.requeued == [str(pending.pk)]


def test_it_ignores_a_duplicate_delivery_of_a_started_run(alice_api):
    session_id = grown_session(alice_api, events=coding_turns(count=12))
    started = _orphan(session_id, status="running", age=0)
    before = all_events(alice_api, session_id=session_id)
    # The broker redelivers the first attempt's task (visibility timeout, or the sweeper
    # re-queued a run whose task was only late): it must not run the compaction twice.
    run = compaction_execute(run_id=started.pk, attempt=0)
    assert run.status == "running" and run.attempts == 1
    assert all_events(alice_api, session_id=session_id) == before
    # A retry (the task's second attempt) does run it.
    assert compaction_execute(run_id=started.pk, attempt=1).status == "completed"


def test_it_schedules_the_sweep_on_celery_beat_and_matches_the_visibility_timeout(settings):
    schedule = settings.CELERY_BEAT_SCHEDULE["sweep-stale-compactions"]
    assert schedule["task"] in app.tasks
    assert schedule["task"] == sweep_stale_compactions.name
    assert schedule["schedule"] == settings.COMPACTION_SWEEP_SECONDS
    options = app.conf.broker_transport_options
    assert options["visibility_timeout"] == settings.COMPACTION_STALE_SECONDS


# --- by hand: the command and the admin -------------------------------------------------------


def test_it_clears_a_run_by_hand_with_the_command(alice_api):
    session_id = grown_session(alice_api, events=coding_turns(count=3))
    # Beating a second ago: the sweep leaves it, the operator's --run does not.
    run = _orphan(session_id, status="running", age=1)
    out = io.StringIO()
    call_command("clear_stale_runs", stdout=out)
    assert "0 failed, 0 queued again" in out.getvalue()
    assert CompactionRun.objects.get(pk=run.pk).status == "running"

    out = io.StringIO()
    call_command("clear_stale_runs", "--run", str(run.pk), stdout=out)
    assert f"{run.pk}: failed (was running)" in out.getvalue()
    stored = alice_api.get(f"/api/v1/compactions/{run.pk}").json()
    assert stored["status"] == "failed" and "cleared by hand" in stored["error"]
    out = io.StringIO()
    call_command("clear_stale_runs", "--run", str(run.pk), stdout=out)
    assert "left alone, already failed" in out.getvalue()
    with pytest.raises(CommandError, match="not a compaction id"):
        call_command("clear_stale_runs", "--run", "nope")
    with pytest.raises(CommandError, match="no compaction with id"):
        call_command("clear_stale_runs", "--run", "00000000-0000-0000-0000-000000000000")
    request_compaction(alice_api, session_id=session_id)


def test_it_sweeps_with_a_given_window_from_the_command(alice_api):
    session_id = grown_session(alice_api, events=coding_turns(count=3))
    run = _orphan(session_id, status="running", age=10)
    out = io.StringIO()
    call_command("clear_stale_runs", "--older-than", "5", stdout=out)
    assert f"{run.pk}: failed (stale)" in out.getvalue()
    assert CompactionRun.objects.get(pk=run.pk).status == "failed"


def test_it_clears_selected_runs_from_the_admin(alice_api, staff):
    staff.user_permissions.add(
        *Permission.objects.filter(codename__in=["view_compactionrun", "change_compactionrun"])
    )
    session_id = grown_session(alice_api, events=coding_turns(count=3))
    stuck = _orphan(session_id, status="pending", age=0)
    finished = _orphan(session_id, status="completed", age=60)
    client = Client()
    client.force_login(staff)
    listing = client.get("/admin/compaction_app/compactionrun/?status__exact=pending")
    assert listing.status_code == 200 and str(stuck.pk) in listing.content.decode()
    response = client.post(
        "/admin/compaction_app/compactionrun/",
        {"action": "clear_selected", "_selected_action": [str(stuck.pk), str(finished.pk)]},
        follow=True,
    )
    assert response.status_code == 200
    assert "Failed 1 run(s); 1 already finished" in response.content.decode()
    stuck.refresh_from_db()
    finished.refresh_from_db()
    assert stuck.status == "failed" and "admin, staff" in stuck.error
    assert finished.status == "completed"
    request_compaction(alice_api, session_id=session_id)
