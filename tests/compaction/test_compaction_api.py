"""The compaction REST endpoints: request, conflict, dry run, list/detail, visibility, errors."""

from __future__ import annotations

import threading
import time
from datetime import datetime
from typing import Any

import pytest
from django.db import connection

from compaction_app.models import CompactionRun
from tests.support.helpers import (
    all_events,
    coding_turns,
    create_session,
    grown_session,
    wait_for_run,
)

# The compaction document of the design (REST API section), field for field.
DESIGN_FIELDS = {
    "id",
    "sessionId",
    "strategy",
    "trigger",
    "status",
    "tokensBefore",
    "tokensAfter",
    "eventsBefore",
    "eventsAfter",
    "reductionPercent",
    "summaryTokens",
    "error",
    "createdAt",
    "startedAt",
    "finishedAt",
}
# Documented additions: which summarizer the run used, whether and when it was reverted, the
# thread it compacted (docs/fitting.md).
EXTRA_FIELDS = {
    "economics",
    "summarizer",
    "revertedAt",
    "reverted",
    "lossReport",
    "thread",
    "outcome",
    "reason",
    "foldedCount",
}


def _snapshot(api, session_id: str) -> dict[str, Any]:
    return {
        "events": api.get(
            f"/api/v1/sessions/{session_id}/events?includeCompacted=true&limit=1000"
        ).json(),
        "usage": api.get(f"/api/v1/sessions/{session_id}/usage").json(),
        "runs": api.get(f"/api/v1/sessions/{session_id}/compactions").json(),
        "summary": api.get(f"/api/v1/sessions/{session_id}/summary").status_code,
    }


def _parse_time(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


# --- request and conflict (no worker: the run stays pending) ----------------------------------


@pytest.mark.django_db
def test_it_accepts_a_compaction_as_pending_and_refuses_a_second_with_409(alice_api):
    session_id = grown_session(alice_api, events=coding_turns(count=12))
    first = alice_api.post(
        f"/api/v1/sessions/{session_id}/compactions", {"strategy": "trim"}, format="json"
    )
    assert first.status_code == 202, first.json()
    body = first.json()
    assert body["status"] == "pending" and body["trigger"] == "manual"
    assert body["strategy"] == "trim" and body["sessionId"] == session_id

    second = alice_api.post(f"/api/v1/sessions/{session_id}/compactions", {}, format="json")
    assert second.status_code == 409
    assert second.json()["error"] == "compaction_in_progress"
    assert second.json()["compactionId"] == body["id"]
    # A running run blocks as well.
    CompactionRun.objects.filter(pk=body["id"]).update(status="running")
    third = alice_api.post(f"/api/v1/sessions/{session_id}/compactions", {}, format="json")
    assert third.status_code == 409 and third.json()["error"] == "compaction_in_progress"
    assert CompactionRun.objects.filter(session_id=session_id).count() == 1


@pytest.mark.django_db(transaction=True)
def test_it_accepts_exactly_one_of_four_concurrent_requests(worker, alice, api_for):
    session_id = grown_session(api_for(alice), events=coding_turns(count=12))
    barrier = threading.Barrier(4)
    statuses: list[int] = []
    errors: list[str] = []

    def request() -> None:
        client = api_for(alice)
        try:
            barrier.wait(timeout=10)
            response = client.post(f"/api/v1/sessions/{session_id}/compactions", {}, format="json")
            statuses.append(response.status_code)
            if response.status_code == 409:
                errors.append(response.json()["error"])
        finally:
            connection.close()

    threads = [threading.Thread(target=request) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert sorted(statuses) == [202, 409, 409, 409]
    assert errors == ["compaction_in_progress"] * 3
    assert CompactionRun.objects.filter(session_id=session_id).count() == 1
    run = CompactionRun.objects.get(session_id=session_id)
    assert wait_for_run(api_for(alice), run_id=str(run.pk))["status"] == "completed"


# --- dry run -------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("strategy", ["summarize", "trim", "clear_tool_results"])
def test_it_plans_a_dry_run_without_changing_anything(worker, alice_api, strategy):
    session_id = grown_session(alice_api, events=coding_turns(count=12), limit=3000)
    before = _snapshot(alice_api, session_id)

    response = alice_api.post(
        f"/api/v1/sessions/{session_id}/compactions",
        {"strategy": strategy, "dryRun": True},
        format="json",
    )
    assert response.status_code == 200, response.json()
    plan = response.json()
    assert plan["dryRun"] is True and plan["strategy"] == strategy
    assert plan["tokensBefore"] == before["usage"]["contextTokens"]
    assert plan["tokensAfter"] < plan["tokensBefore"]
    stored = {e["id"]: e for e in before["events"]["results"]}
    if strategy == "clear_tool_results":
        assert plan["eventsToFold"] == [] and plan["toolResultsToClear"]
        assert all(stored[i]["type"] == "TOOL_RESULT" for i in plan["toolResultsToClear"])
    else:
        assert plan["eventsToFold"] and set(plan["eventsToFold"]) <= set(stored)
    time.sleep(0.3)  # a wrongly enqueued run would have had time to change something
    assert _snapshot(alice_api, session_id) == before
    assert before["runs"]["count"] == 0
    assert not CompactionRun.objects.filter(session_id=session_id).exists()

    # The plan is what a real run then does.
    run = alice_api.post(
        f"/api/v1/sessions/{session_id}/compactions", {"strategy": strategy}, format="json"
    ).json()
    done = wait_for_run(alice_api, run_id=run["id"])
    assert done["status"] == "completed"
    if strategy == "trim":
        assert done["tokensAfter"] == plan["tokensAfter"]
    if strategy == "summarize":
        assert done["tokensAfter"] <= plan["tokensAfter"]
    events = all_events(alice_api, session_id=session_id)
    folded = sorted(e["id"] for e in events if e["compactedBy"] and e["id"] in stored)
    assert folded == sorted(plan["eventsToFold"])


@pytest.mark.django_db
def test_it_refuses_a_dry_run_with_an_unknown_strategy_or_summarizer(alice_api):
    session_id = create_session(alice_api)
    for body, field in (
        ({"strategy": "shrink", "dryRun": True}, "strategy"),
        ({"summarizer": "gpt-oracle", "dryRun": True}, "summarizer"),
    ):
        response = alice_api.post(f"/api/v1/sessions/{session_id}/compactions", body, format="json")
        assert response.status_code == 400, (body, response.json())
        assert response.json()["error"] == f"unknown_{field}"


# --- list and detail ------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_it_lists_and_shows_runs_with_the_documented_fields(worker, alice_api):
    session_id = grown_session(alice_api, events=coding_turns(count=12))
    first = alice_api.post(
        f"/api/v1/sessions/{session_id}/compactions",
        {"strategy": "clear_tool_results"},
        format="json",
    ).json()
    assert set(first) >= DESIGN_FIELDS and set(first) - DESIGN_FIELDS <= EXTRA_FIELDS
    assert first["tokensBefore"] is None and first["startedAt"] is None
    wait_for_run(alice_api, run_id=first["id"])
    second = alice_api.post(f"/api/v1/sessions/{session_id}/compactions", {}, format="json").json()
    done = wait_for_run(alice_api, run_id=second["id"])

    listing = alice_api.get(f"/api/v1/sessions/{session_id}/compactions")
    assert listing.status_code == 200
    body = listing.json()
    assert body["count"] == 2
    assert [r["id"] for r in body["results"]] == [second["id"], first["id"]]  # newest first
    for run in body["results"]:
        assert set(run) >= DESIGN_FIELDS and set(run) - DESIGN_FIELDS <= EXTRA_FIELDS
    assert body["results"][0] == done

    assert done["status"] == "completed" and done["trigger"] == "manual"
    assert done["strategy"] == "summarize" and done["sessionId"] == session_id
    assert done["error"] is None
    for key in ("tokensBefore", "tokensAfter", "eventsBefore", "eventsAfter", "summaryTokens"):
        assert isinstance(done[key], int), key
    assert isinstance(done["reductionPercent"], float)
    assert done["reductionPercent"] == round(
        100 * (done["tokensBefore"] - done["tokensAfter"]) / done["tokensBefore"], 1
    )
    created, started, finished = (
        _parse_time(done[k]) for k in ("createdAt", "startedAt", "finishedAt")
    )
    assert created <= started <= finished
    usage = alice_api.get(f"/api/v1/sessions/{session_id}/usage").json()
    assert usage["lastCompaction"]["id"] == done["id"]
    assert usage["contextTokens"] == done["tokensAfter"]

    assert alice_api.get("/api/v1/compactions/not-a-uuid").status_code == 404
    missing = alice_api.get("/api/v1/compactions/00000000-0000-0000-0000-000000000000")
    assert missing.status_code == 404 and missing.json()["error"] == "not_found"


# --- visibility and bad input ---------------------------------------------------------------


@pytest.mark.django_db
def test_it_hides_alices_runs_and_sessions_from_bob(alice_api, bob_api, staff_api):
    session_id = grown_session(alice_api, events=coding_turns(count=12))
    run = alice_api.post(f"/api/v1/sessions/{session_id}/compactions", {}, format="json").json()
    CompactionRun.objects.filter(pk=run["id"]).update(status="completed")
    for method, url in (
        ("get", f"/api/v1/compactions/{run['id']}"),
        ("post", f"/api/v1/compactions/{run['id']}/revert"),
        ("get", f"/api/v1/sessions/{session_id}/compactions"),
        ("post", f"/api/v1/sessions/{session_id}/compactions"),
        ("get", f"/api/v1/sessions/{session_id}/summary"),
    ):
        response = getattr(bob_api, method)(url, {}, format="json")
        assert response.status_code == 404, (method, url, response.status_code)
        assert response.json()["error"] == "not_found"
    assert CompactionRun.objects.filter(session_id=session_id).count() == 1
    # Staff see every session's runs.
    assert staff_api.get(f"/api/v1/compactions/{run['id']}").status_code == 200
    listing = staff_api.get(f"/api/v1/sessions/{session_id}/compactions").json()
    assert [r["id"] for r in listing["results"]] == [run["id"]]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"strategy": "shrink"}, "unknown_strategy"),
        ({"summarizer": "gpt-oracle"}, "unknown_summarizer"),
        ({"strategy": ""}, None),
        ({"strategy": 3}, None),
        ({"dryRun": "yes"}, None),
        ({"targetRatio": 0}, None),
        ({"targetRatio": 1.5}, None),
    ],
)
def test_it_refuses_bad_compaction_requests_with_400(alice_api, body, code):
    session_id = create_session(alice_api)
    response = alice_api.post(f"/api/v1/sessions/{session_id}/compactions", body, format="json")
    assert response.status_code == 400, response.json()
    if code:
        assert response.json()["error"] == code
    assert not CompactionRun.objects.filter(session_id=session_id).exists()


@pytest.mark.django_db
def test_it_refuses_unauthenticated_compaction_requests(alice_api, client):
    session_id = create_session(alice_api)
    response = client.post(f"/api/v1/sessions/{session_id}/compactions", {})
    assert response.status_code == 401
