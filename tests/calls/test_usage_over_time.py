"""Usage over time (`GET /api/v1/usage/calls`): calls per hour or day in the viewer's time
zone, grouped by model, user, session or status, with tokens by kind, cost, cache hit rate,
p50/p99 latency and error rate; read from the 15-minute rollup, which equals the calls even
when a call is saved after its window was rolled up; a user sees only their own calls."""

from __future__ import annotations

import datetime

import pytest
from django.utils import timezone

from sessions_app import call_rollup
from sessions_app.calls import call_record
from sessions_app.models import CallRollup, CallRollupBucket
from sessions_app.services import session_create

pytestmark = pytest.mark.django_db(transaction=True)

NOW = timezone.now()


def _calls(session, *, hours_ago: float, count: int, model="gpt-4o", status="ok", ms=100):
    for n in range(count):
        call_record(
            session_id=session.pk,
            owner_id=session.owner_id,
            started_at=NOW - datetime.timedelta(hours=hours_ago, seconds=n),
            wire="openai",
            status=status,
            model_requested=model,
            model_served=model,
            http_status=200 if status == "ok" else 500,
            prompt_tokens=100,
            cached_input_tokens=40,
            completion_tokens=10,
            ttfb_ms=ms // 2,
            total_ms=ms + n,
            gateway_ms=2,
        )


def test_it_groups_calls_per_hour_by_model_with_their_figures(alice, alice_api, bob):
    mine = session_create(owner=alice, model="gpt-4o", title="mine")
    theirs = session_create(owner=bob, model="gpt-4o", title="theirs")
    _calls(mine, hours_ago=5, count=4)
    _calls(mine, hours_ago=5, count=2, model="gpt-4o-mini", status="provider_error", ms=900)
    _calls(mine, hours_ago=0.1, count=3)
    _calls(theirs, hours_ago=5, count=7)
    since = (NOW - datetime.timedelta(hours=8)).isoformat()
    data = alice_api.get(
        "/api/v1/usage/calls", {"since": since, "bucket": "hour", "groupBy": "model"}
    ).json()
    assert data["totals"]["calls"] == 9  # bob's calls are not alice's
    series = {s["key"]: s for s in data["series"]}
    assert series["gpt-4o"]["totals"]["calls"] == 7
    assert series["gpt-4o-mini"]["totals"]["errors"] == 2
    assert series["gpt-4o-mini"]["totals"]["errorRate"] == 100.0
    assert data["totals"]["cacheHitRate"] == 0.4
    assert data["totals"]["promptTokens"] == 900 and data["totals"]["completionTokens"] == 90
    five = [p for p in data["points"] if p["calls"] == 6]
    assert len(five) == 1
    # p50 / p99 from the histograms: within an edge of the true values.
    assert 90 <= five[0]["latencyMs"]["p50"] <= 130
    assert 800 <= five[0]["latencyMs"]["p99"] <= 1000
    # The closed windows were rolled up on this read; the open one was not.
    assert CallRollupBucket.objects.exists()
    # (Against the clock of the read: NOW is this module's import, minutes before a long run
    # reaches this test.)
    still_open = call_rollup.window_of(timezone.now() - call_rollup.GRACE)
    assert not CallRollupBucket.objects.filter(bucket__gte=still_open).exists()
    again = alice_api.get(
        "/api/v1/usage/calls", {"since": since, "bucket": "hour", "groupBy": "model"}
    ).json()
    assert again["totals"] == data["totals"]


def test_it_counts_a_call_saved_after_its_window_was_rolled_up(alice, alice_api):
    session = session_create(owner=alice, model="gpt-4o")
    _calls(session, hours_ago=3, count=2)
    since = (NOW - datetime.timedelta(hours=4)).isoformat()
    assert alice_api.get("/api/v1/usage/calls", {"since": since}).json()["totals"]["calls"] == 2
    assert CallRollup.objects.filter(calls=2).exists()
    # A stream that began in that window ends now.
    _calls(session, hours_ago=3, count=1)
    assert alice_api.get("/api/v1/usage/calls", {"since": since}).json()["totals"]["calls"] == 3


def test_it_buckets_days_in_the_viewers_time_zone(alice, alice_api):
    session = session_create(owner=alice, model="gpt-4o")
    _calls(session, hours_ago=30, count=1)
    data = alice_api.get(
        "/api/v1/usage/calls",
        {
            "since": (NOW - datetime.timedelta(days=3)).isoformat(),
            "bucket": "day",
            "tz": "Asia/Kathmandu",
            "groupBy": "session",
        },
    ).json()
    assert data["tz"] == "Asia/Kathmandu"
    assert all(p.endswith("+05:45") and "T00:00:00" in p for p in data["periods"])
    assert data["series"][0]["label"] == str(session)


def test_it_refuses_bad_parameters(alice_api):
    for params in (
        {"bucket": "week"},
        {"groupBy": "colour"},
        {"tz": "Mars/Olympus"},
        {"since": "yesterday"},
        {"user": "one"},
    ):
        answer = alice_api.get("/api/v1/usage/calls", params)
        assert answer.status_code == 400, params
        assert answer.json()["error"] == "invalid_parameter"
    # Another user's calls: staff only.
    answer = alice_api.get("/api/v1/usage/calls", {"user": "1"})
    assert (answer.status_code, answer.json()["error"]) == (403, "permission_denied")
