"""A Redis outage, for real: a private redis-server on a spare port backs the cache (throttle),
the channel layer and the Celery broker for these tests, and is stopped mid-test (the shared
Redis other test runs use is never touched).

During the outage reads keep working, appends are stored and acknowledged, and what needs the
broker answers 503 `service_unavailable` with Retry-After and leaves no run behind. Once Redis
is back the next calls succeed. Runs on both profiles (SQLite or PostgreSQL); skipped when no
redis-server binary is installed.
"""

from __future__ import annotations

import logging
import shutil

import pytest

from compaction_app.models import CompactionRun
from sessions_app.models import Event
from tests.support.helpers import append_events, create_session
from tests.support.private_redis import running_private_redis, this_process_on

pytestmark = pytest.mark.skipif(
    shutil.which("redis-server") is None, reason="redis-server is not installed"
)


@pytest.fixture
def on_private_redis(settings):
    """Cache, channel layer and Celery broker of this process on a private Redis."""
    with running_private_redis() as server, this_process_on(settings, server):
        yield server


@pytest.mark.django_db(transaction=True)
def test_it_keeps_reads_and_appends_working_while_redis_is_down(
    alice, alice_api, on_private_redis, caplog
):
    session_id = create_session(alice_api)
    append_events(alice_api, session_id=session_id, events={"type": "USER_MESSAGE", "content": "a"})

    on_private_redis.stop()
    with caplog.at_level(logging.WARNING):
        usage = alice_api.get(f"/api/v1/sessions/{session_id}/usage")
        listed = alice_api.get(f"/api/v1/sessions/{session_id}/events")
        appended = alice_api.post(
            f"/api/v1/sessions/{session_id}/events",
            {"type": "USER_MESSAGE", "content": "stored during the outage"},
            format="json",
        )

    assert usage.status_code == 200, usage.content
    assert listed.status_code == 200, listed.content
    assert appended.status_code == 201, appended.content
    stored = Event.objects.get(pk=appended.json()["id"])
    assert stored.content == "stored during the outage"
    messages = [record.getMessage() for record in caplog.records]
    assert any("rate limit not applied" in m for m in messages), messages
    assert any("websocket broadcast for session" in m and "skipped" in m for m in messages)


@pytest.mark.django_db(transaction=True)
def test_it_answers_503_and_creates_no_run_when_the_broker_is_down(
    alice, alice_api, on_private_redis
):
    session_id = create_session(alice_api)
    append_events(alice_api, session_id=session_id, events={"type": "USER_MESSAGE", "content": "a"})

    on_private_redis.stop()
    compaction = alice_api.post(
        f"/api/v1/sessions/{session_id}/compactions", {"strategy": "trim"}, format="json"
    )
    command = alice_api.post(
        f"/api/v1/sessions/{session_id}/events",
        {"type": "USER_MESSAGE", "content": "/compact trim"},
        format="json",
    )

    for response in (compaction, command):
        assert response.status_code == 503, response.content
        assert response.json()["error"] == "service_unavailable"
        assert int(response["Retry-After"]) > 0
    assert not CompactionRun.objects.filter(session_id=session_id).exists()
    # The session is not blocked: nothing pending or failed stands in the way afterwards.
    listed = alice_api.get(f"/api/v1/sessions/{session_id}/compactions")
    assert listed.status_code == 200
    assert listed.json()["results"] == []


@pytest.mark.django_db(transaction=True)
def test_it_serves_the_first_calls_after_redis_returns(alice, alice_api, on_private_redis):
    session_id = create_session(alice_api)
    # Every client opens its connections while Redis is up...
    append_events(alice_api, session_id=session_id, events={"type": "USER_MESSAGE", "content": "a"})
    # ...which then all go stale across a restart.
    on_private_redis.stop()
    assert alice_api.get(f"/api/v1/sessions/{session_id}/usage").status_code == 200
    on_private_redis.start()

    usage = alice_api.get(f"/api/v1/sessions/{session_id}/usage")
    appended = alice_api.post(
        f"/api/v1/sessions/{session_id}/events",
        {"type": "USER_MESSAGE", "content": "after the restart"},
        format="json",
    )
    compaction = alice_api.post(
        f"/api/v1/sessions/{session_id}/compactions", {"strategy": "trim"}, format="json"
    )

    assert usage.status_code == 200, usage.content
    assert appended.status_code == 201, appended.content
    assert compaction.status_code == 202, compaction.content
    # The run reached the broker: its task sits in the (restarted) private Redis queue.
    assert CompactionRun.objects.filter(session_id=session_id, status="pending").count() == 1
