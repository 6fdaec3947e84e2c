"""What starts a compaction: `/compact`, auto, refresh, the hard limit of `/context`, the admin."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection
from django.test import Client

from compaction_app.models import CompactionRun
from compaction_app.signals import memory_flush
from compaction_app.testkit.provider_standin import unauthorized
from sessions_app.models import Session
from sessions_app.signals import session_compaction_requested
from tests.support.helpers import (
    SYSTEM_PROMPT,
    all_events,
    append_events,
    coding_turns,
    create_session,
    fake_openai,
    wait_for_run,
)

pytestmark = pytest.mark.django_db(transaction=True)


def _usage(api, session_id: str) -> dict[str, Any]:
    return api.get(f"/api/v1/sessions/{session_id}/usage").json()


def _runs(api, session_id: str) -> list[dict[str, Any]]:
    return api.get(f"/api/v1/sessions/{session_id}/compactions").json()["results"]


# --- /compact -------------------------------------------------------------------------------


def test_it_starts_a_manual_compaction_from_a_compact_message_without_storing_it(worker, alice_api):
    session_id = create_session(alice_api)
    append_events(alice_api, session_id=session_id, events=coding_turns(count=12))
    before = _usage(alice_api, session_id)
    stored_before = all_events(alice_api, session_id=session_id)

    response = alice_api.post(
        f"/api/v1/sessions/{session_id}/events",
        {"type": "USER_MESSAGE", "content": "/compact"},
        format="json",
    )
    assert response.status_code == 202, response.json()
    run = response.json()
    assert run["status"] == "pending" and run["trigger"] == "manual"
    assert run["strategy"] == "summarize" and run["sessionId"] == session_id
    assert wait_for_run(alice_api, run_id=run["id"])["status"] == "completed"
    events = all_events(alice_api, session_id=session_id)
    assert not any(e["content"] == "/compact" for e in events)
    assert [e["type"] for e in events].count("COMPACTION") == 1
    assert len(events) == len(stored_before) + 1  # the run's COMPACTION event only
    after = _usage(alice_api, session_id)
    assert after["cumulativeTokens"] >= before["cumulativeTokens"]

    trim = alice_api.post(
        f"/api/v1/sessions/{session_id}/events",
        {"type": "USER_MESSAGE", "content": "  /compact trim"},
        format="json",
    )
    assert trim.status_code == 202, trim.json()
    assert trim.json()["strategy"] == "trim"
    wait_for_run(alice_api, run_id=trim.json()["id"])
    assert [r["strategy"] for r in _runs(alice_api, session_id)] == ["trim", "summarize"]


def test_it_refuses_a_compact_message_inside_a_bulk_list_or_with_a_bad_strategy(worker, alice_api):
    session_id = create_session(alice_api)
    append_events(alice_api, session_id=session_id, events=coding_turns(count=2))
    before = all_events(alice_api, session_id=session_id)
    bulk = alice_api.post(
        f"/api/v1/sessions/{session_id}/events",
        [
            {"type": "AGENT_MESSAGE", "content": "done"},
            {"type": "USER_MESSAGE", "content": "/compact"},
        ],
        format="json",
    )
    assert bulk.status_code == 400
    assert bulk.json()["error"] == "compact_command_in_bulk"
    bad = alice_api.post(
        f"/api/v1/sessions/{session_id}/events",
        {"type": "USER_MESSAGE", "content": "/compact shrink"},
        format="json",
    )
    assert bad.status_code == 400 and bad.json()["error"] == "unknown_strategy"
    assert all_events(alice_api, session_id=session_id) == before
    assert _runs(alice_api, session_id) == []


def test_it_answers_409_to_a_compact_message_while_a_run_is_pending(alice, alice_api):
    session_id = create_session(alice_api)
    CompactionRun.objects.create(
        session_id=session_id, strategy="summarize", trigger="manual", summarizer="local"
    )
    response = alice_api.post(
        f"/api/v1/sessions/{session_id}/events",
        {"type": "USER_MESSAGE", "content": "/compact"},
        format="json",
    )
    assert response.status_code == 409
    assert response.json()["error"] == "compaction_in_progress"


# --- auto -----------------------------------------------------------------------------------


def test_it_starts_one_auto_run_when_an_append_crosses_the_threshold_then_cools_down(
    worker, alice_api
):
    session_id = create_session(alice_api, limit=2000, autoCompact=True, cooldownSeconds=60)
    append_events(alice_api, session_id=session_id, events=coding_turns(count=5))
    assert not _usage(alice_api, session_id)["nearLimit"]
    assert _runs(alice_api, session_id) == []

    append_events(
        alice_api, session_id=session_id, events=coding_turns(start=5, count=3)
    )  # crosses 80 %
    runs = _runs(alice_api, session_id)
    assert [(r["trigger"], r["strategy"]) for r in runs] == [("auto", "summarize")]
    done = wait_for_run(alice_api, run_id=runs[0]["id"])
    assert done["status"] == "completed"
    assert not _usage(alice_api, session_id)["nearLimit"]

    append_events(
        alice_api, session_id=session_id, events=coding_turns(start=8, count=4)
    )  # crosses again, within the cooldown (below the hard limit, which ignores it)
    usage = _usage(alice_api, session_id)
    assert usage["nearLimit"] and not usage["atLimit"]
    assert [r["id"] for r in _runs(alice_api, session_id)] == [runs[0]["id"]]


def test_it_starts_another_auto_run_once_the_cooldown_has_passed(worker, alice_api):
    session_id = create_session(alice_api, limit=2000, autoCompact=True, cooldownSeconds=0)
    append_events(alice_api, session_id=session_id, events=coding_turns(count=8))
    first = _runs(alice_api, session_id)
    assert len(first) == 1
    wait_for_run(alice_api, run_id=first[0]["id"])
    append_events(alice_api, session_id=session_id, events=coding_turns(start=8, count=6))
    runs = _runs(alice_api, session_id)
    assert [r["trigger"] for r in runs] == ["auto", "auto"]
    wait_for_run(alice_api, run_id=runs[0]["id"])


def test_it_compacts_past_the_hard_limit_within_the_cooldown(worker, alice_api):
    session_id = create_session(alice_api, limit=2000, autoCompact=True, cooldownSeconds=3600)
    append_events(alice_api, session_id=session_id, events=coding_turns(count=8))
    first = _runs(alice_api, session_id)
    assert [r["trigger"] for r in first] == ["auto"]
    assert wait_for_run(alice_api, run_id=first[0]["id"])["status"] == "completed"

    # Well within the hour's cooldown, an append pushes the context past hardLimitThreshold.
    append_events(alice_api, session_id=session_id, events=coding_turns(start=8, count=6))
    runs = _runs(alice_api, session_id)
    assert [r["trigger"] for r in runs] == ["hard_limit", "auto"]
    assert runs[0]["tokensBefore"] is None  # queued for the worker, not run in the request
    done = wait_for_run(alice_api, run_id=runs[0]["id"])
    assert done["status"] == "completed"
    assert done["tokensBefore"] >= 0.95 * 2000 > done["tokensAfter"]
    assert not _usage(alice_api, session_id)["atLimit"]


def test_it_never_starts_an_auto_run_when_auto_compact_is_off(worker, alice_api):
    session_id = create_session(alice_api, limit=2000, autoCompact=False)
    append_events(alice_api, session_id=session_id, events=coding_turns(count=8))
    assert _usage(alice_api, session_id)["nearLimit"]
    assert _runs(alice_api, session_id) == []


def test_it_keeps_auto_compaction_failures_away_from_the_appending_client(
    worker, alice_api, settings
):
    with fake_openai(settings, default=unauthorized()):
        session_id = create_session(alice_api, limit=2000, autoCompact=True, summarizer="openai")
        append_events(alice_api, session_id=session_id, events=coding_turns(count=5))
        before = all_events(alice_api, session_id=session_id)
        stored = append_events(
            alice_api, session_id=session_id, events=coding_turns(start=5, count=3)
        )  # crosses: 201 regardless
        assert len(stored) == 12
        run = wait_for_run(alice_api, run_id=_runs(alice_api, session_id)[0]["id"])
    assert run["status"] == "failed" and run["trigger"] == "auto"
    assert "401" in run["error"]
    events = all_events(alice_api, session_id=session_id)
    assert len(events) == len(before) + 12
    assert all(e["compactedBy"] is None for e in events)
    assert alice_api.get(f"/api/v1/sessions/{session_id}/summary").status_code == 404
    # Later appends still succeed (the failed run does not block anything).
    append_events(
        alice_api, session_id=session_id, events={"type": "AGENT_MESSAGE", "content": "still here"}
    )


def test_it_keeps_a_broken_auto_check_away_from_the_appending_client(worker, alice_api):
    session_id = create_session(alice_api, limit=2000, autoCompact=True)
    # Settings damaged behind the API's back (a bad migration, a manual edit): the usage
    # broadcast and the threshold check fail, the append itself must not.
    session = Session.objects.get(pk=session_id)
    Session.objects.filter(pk=session_id).update(
        settings={**session.settings, "compactThreshold": "high", "refreshThresholdTokens": None}
    )
    stored = append_events(alice_api, session_id=session_id, events=coding_turns(count=8))
    assert len(stored) == 32
    assert Session.objects.get(pk=session_id).event_count == 33


# --- refresh --------------------------------------------------------------------------------


def test_it_refreshes_the_context_when_cumulative_tokens_reach_the_threshold(worker, alice_api):
    session_id = create_session(
        alice_api, limit=8000, refreshThresholdTokens=600, maxSummaryTokens=32
    )
    append_events(alice_api, session_id=session_id, events=coding_turns(count=2))
    assert _usage(alice_api, session_id)["cumulativeTokens"] < 600
    cumulative_at_flush: list[int] = []

    def record(sender, *, session_id, **kwargs):
        cumulative_at_flush.append(Session.objects.get(pk=session_id).cumulative_tokens)

    memory_flush.connect(record, weak=False)
    try:
        trigger = append_events(
            alice_api, session_id=session_id, events=coding_turns(start=2, count=1)
        )
        # The counter is reset before the run starts (it would be >= 600 otherwise).
        assert _usage(alice_api, session_id)["cumulativeTokens"] < 600
        runs = _runs(alice_api, session_id)
        assert [(r["trigger"], r["strategy"]) for r in runs] == [("refresh", "summarize")]
        run = wait_for_run(alice_api, run_id=runs[0]["id"])
    finally:
        memory_flush.disconnect(record)
    assert run["status"] == "completed", run
    assert cumulative_at_flush == [0]

    events = all_events(alice_api, session_id=session_id)
    last_client_seq = trigger[-1]["seq"]
    added = [e for e in events if e["seq"] > last_client_seq]
    assert [e["type"] for e in added] == ["COMPACTION", "CONTEXT_REFRESH"]
    refresh = added[-1]
    assert refresh["content"].startswith("[CONTEXT REFRESH]")
    assert refresh["compactedBy"] is None and refresh["tokenCount"] > 0
    usage = _usage(alice_api, session_id)
    # Neither synthetic event (the summary, the refresh turn) counts toward the next refresh.
    assert usage["cumulativeTokens"] == 0
    context = alice_api.get(f"/api/v1/sessions/{session_id}/context").json()
    assert context["messages"][-1] == {"role": "user", "content": refresh["content"]}
    assert context["summary"]


def test_it_postpones_a_refresh_while_another_compaction_is_active(worker, alice_api):
    session_id = create_session(
        alice_api, limit=8000, refreshThresholdTokens=600, maxSummaryTokens=32
    )
    append_events(alice_api, session_id=session_id, events=coding_turns(count=2))
    blocker = CompactionRun.objects.create(
        session_id=session_id, strategy="trim", trigger="manual", summarizer="local"
    )
    append_events(
        alice_api, session_id=session_id, events=coding_turns(start=2, count=1)
    )  # crosses while the blocker is pending
    assert [r["id"] for r in _runs(alice_api, session_id)] == [str(blocker.pk)]
    assert _usage(alice_api, session_id)["cumulativeTokens"] >= 600  # kept for later

    CompactionRun.objects.filter(pk=blocker.pk).update(status="failed")
    append_events(
        alice_api, session_id=session_id, events={"type": "AGENT_MESSAGE", "content": "ok"}
    )
    runs = _runs(alice_api, session_id)
    assert [r["trigger"] for r in runs] == ["refresh", "manual"]
    assert wait_for_run(alice_api, run_id=runs[0]["id"])["status"] == "completed"
    assert _usage(alice_api, session_id)["cumulativeTokens"] == 0


def test_it_fires_exactly_one_refresh_for_concurrent_appends_crossing_the_threshold(
    worker, alice, api_for
):
    api = api_for(alice)
    session_id = create_session(api, limit=20000, refreshThresholdTokens=1000, maxSummaryTokens=16)
    append_events(api, session_id=session_id, events=coding_turns(count=3))
    start = _usage(api, session_id)["cumulativeTokens"]
    assert 600 < start < 1000
    barrier = threading.Barrier(6)
    statuses: list[int] = []
    # The clients are made here: each one reads the token, and six threads opening database
    # connections for that on a loaded machine could miss the barrier's timeout.
    clients = [api_for(alice) for _ in range(6)]

    def append(turn: int) -> None:
        client = clients[turn]
        try:
            barrier.wait(timeout=30)
            response = client.post(
                f"/api/v1/sessions/{session_id}/events",
                {"type": "AGENT_MESSAGE", "content": f"step {turn}: " + "word " * 80},
                format="json",
            )
            statuses.append(response.status_code)
        finally:
            connection.close()

    threads = [threading.Thread(target=append, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert statuses == [201] * 6
    runs = _runs(api, session_id)
    assert [r["trigger"] for r in runs] == ["refresh"]
    assert wait_for_run(api, run_id=runs[0]["id"])["status"] == "completed"
    refreshes = [
        e for e in all_events(api, session_id=session_id) if e["type"] == "CONTEXT_REFRESH"
    ]
    assert len(refreshes) == 1


# --- hard limit via /context ----------------------------------------------------------------


def test_it_compacts_once_between_the_thresholds_then_keeps_the_context_stable(worker, alice_api):
    session_id = create_session(alice_api, limit=4000)
    stored = append_events(alice_api, session_id=session_id, events=coding_turns(count=13))
    usage = _usage(alice_api, session_id)
    assert usage["nearLimit"] and not usage["atLimit"]
    context = alice_api.post(f"/api/v1/sessions/{session_id}/context")
    assert context.status_code == 200
    body = context.json()
    # POST (the compacting ladder) crossing compactThreshold on the session's own window: one
    # compaction down to
    # fitTargetRatio (0.5), not a pruned view that moves on every call.
    assert body["pruned"] is False and body["compaction"]["status"] == "completed"
    assert body["tokenCount"] <= 0.5 * 4000
    assert body["messages"][0] == {"role": "system", "content": SYSTEM_PROMPT}
    users = [m for m in body["messages"] if m["role"] == "user"]
    assert users[-1]["content"] == stored[-4]["content"]
    assert len(_runs(alice_api, session_id)) == 1
    # The next call answers the same messages plus the new one, unchanged before it.
    append_events(
        alice_api, session_id=session_id, events=[{"type": "USER_MESSAGE", "content": "More?"}]
    )
    again = alice_api.post(f"/api/v1/sessions/{session_id}/context").json()
    assert "compaction" not in again
    assert again["messages"][: len(body["messages"])] == body["messages"]
    assert again["messages"][-1] == {"role": "user", "content": "More?"}


def test_it_prunes_between_the_thresholds_when_no_compaction_can_run(worker, alice_api):
    session_id = create_session(alice_api, limit=4000)
    stored = append_events(alice_api, session_id=session_id, events=coding_turns(count=13))
    usage = _usage(alice_api, session_id)
    assert usage["nearLimit"] and not usage["atLimit"]
    # Another run holds the session: no compaction can run now, so the view is pruned.
    CompactionRun.objects.create(
        session_id=session_id, strategy="summarize", summarizer="local", status="running"
    )
    body = alice_api.post(f"/api/v1/sessions/{session_id}/context").json()
    assert body["pruned"] is True and "compaction" not in body
    assert body["tokenCount"] <= 0.8 * 4000
    users = [m for m in body["messages"] if m["role"] == "user"]
    assert users[-1]["content"] == stored[-4]["content"]


def test_it_compacts_synchronously_at_the_hard_limit_then_answers(worker, alice_api):
    session_id = create_session(alice_api, limit=4000)
    stored = append_events(alice_api, session_id=session_id, events=coding_turns(count=15))
    usage = _usage(alice_api, session_id)
    assert usage["atLimit"]
    response = alice_api.post(f"/api/v1/sessions/{session_id}/context")
    assert response.status_code == 200, response.json()
    body = response.json()
    compaction = body["compaction"]
    assert compaction["trigger"] == "hard_limit" and compaction["status"] == "completed"
    assert compaction["tokensBefore"] == usage["contextTokens"]
    assert (
        body["tokenCount"]
        == compaction["tokensAfter"]
        == _usage(alice_api, session_id)["contextTokens"]
    )
    assert body["pruned"] is False and body["summary"]
    assert body["messages"][0] == {"role": "system", "content": SYSTEM_PROMPT}
    assert [m for m in body["messages"] if m["role"] == "user"][-1]["content"] == stored[-4][
        "content"
    ]
    assert [r["id"] for r in _runs(alice_api, session_id)] == [compaction["id"]]
    again = alice_api.post(f"/api/v1/sessions/{session_id}/context").json()
    assert "compaction" not in again


def test_it_answers_422_when_the_must_keep_messages_alone_do_not_fit(worker, alice_api):
    session_id = create_session(alice_api, limit=1000)
    append_events(alice_api, session_id=session_id, events=coding_turns(count=1))
    append_events(
        alice_api,
        session_id=session_id,
        events={"type": "USER_MESSAGE", "content": "lorem ipsum " * 600},
    )
    events_before = all_events(alice_api, session_id=session_id)
    flushed: list[Any] = []

    def on_flush(**kwargs: Any) -> None:
        flushed.append(kwargs)

    memory_flush.connect(on_flush, weak=False)
    try:
        for method in (alice_api.get, alice_api.post, alice_api.post):
            response = method(f"/api/v1/sessions/{session_id}/context")
            assert response.status_code == 422, response.json()
            body = response.json()
            assert body["error"] == "context_window_exhausted"
            assert body["limit"] == 1000 and body["model"] == "gpt-4o"
            assert body["tokenCount"] > 1000
    finally:
        memory_flush.disconnect(on_flush)
    # No compaction can make the system prompt and last message fit: nothing is written, no
    # memory flush fires for a 422.
    assert all_events(alice_api, session_id=session_id) == events_before
    assert _runs(alice_api, session_id) == [] and flushed == []


def test_it_never_writes_on_get_context_at_the_hard_limit(worker, alice_api):
    session_id = create_session(alice_api, limit=4000)
    append_events(alice_api, session_id=session_id, events=coding_turns(count=15))
    usage = _usage(alice_api, session_id)
    assert usage["atLimit"]
    events_before = all_events(alice_api, session_id=session_id)
    for _ in range(3):
        response = alice_api.get(f"/api/v1/sessions/{session_id}/context", {"maxTokens": 4000})
        assert response.status_code == 200, response.json()
        body = response.json()
        assert body["compactionRecommended"] is True and body["pruned"] is True
        assert "compaction" not in body and body["tokenCount"] <= 4000
    assert _runs(alice_api, session_id) == []
    assert all_events(alice_api, session_id=session_id) == events_before
    assert _usage(alice_api, session_id)["contextTokens"] == usage["contextTokens"]


def test_it_says_no_compaction_is_recommended_below_the_threshold(alice_api):
    session_id = create_session(alice_api)
    append_events(alice_api, session_id=session_id, events=coding_turns(count=1))
    body = alice_api.get(f"/api/v1/sessions/{session_id}/context").json()
    assert body["compactionRecommended"] is False and body["pruned"] is False


def test_it_respects_the_cooldown_on_post_context(worker, alice_api):
    session_id = create_session(alice_api, limit=4000)
    append_events(alice_api, session_id=session_id, events=coding_turns(count=15))
    first = alice_api.post(f"/api/v1/sessions/{session_id}/context")
    assert first.status_code == 200 and first.json()["compaction"]["trigger"] == "hard_limit"
    append_events(alice_api, session_id=session_id, events=coding_turns(count=15))
    assert _usage(alice_api, session_id)["atLimit"]
    second = alice_api.post(f"/api/v1/sessions/{session_id}/context")
    assert second.status_code == 200, second.json()
    body = second.json()
    # Within cooldownSeconds (60): pruned, not compacted again.
    assert "compaction" not in body and body["pruned"] is True
    assert body["compactionRecommended"] is True
    assert len(_runs(alice_api, session_id)) == 1


def test_it_refuses_a_cookie_post_context_without_csrf(worker, alice, alice_api):
    session_id = create_session(alice_api, limit=4000)
    append_events(alice_api, session_id=session_id, events=coding_turns(count=15))
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(alice)
    response = browser.post(f"/api/v1/sessions/{session_id}/context")
    assert response.status_code == 403
    # A top-level cross-site navigation is a GET: it answers, and writes nothing.
    assert browser.get(f"/api/v1/sessions/{session_id}/context").status_code == 200
    assert _runs(alice_api, session_id) == []


# --- admin ----------------------------------------------------------------------------------


def test_it_starts_manual_runs_for_the_admin_compaction_signal(worker, alice, alice_api, staff):
    first = create_session(alice_api)
    second = create_session(alice_api)
    append_events(alice_api, session_id=first, events=coding_turns(count=6))
    append_events(alice_api, session_id=second, events=coding_turns(count=6))
    CompactionRun.objects.create(
        session_id=second, strategy="summarize", trigger="manual", summarizer="local"
    )  # busy: skipped, not an error
    responses = session_compaction_requested.send(
        sender=Session, session_ids=[first, second], user=staff
    )
    started = [run_id for _receiver, ids in responses for run_id in ids or []]
    assert len(started) == 1
    run = wait_for_run(alice_api, run_id=started[0])
    assert run["sessionId"] == first and run["trigger"] == "manual"
    assert run["status"] == "completed"
    assert CompactionRun.objects.get(pk=started[0]).requested_by == staff


def test_it_compacts_the_selected_sessions_from_the_django_admin(worker, alice_api, make_user):
    admin_user = make_user("admin", staff=True)
    admin_user.is_superuser = True
    admin_user.save()
    idle = create_session(alice_api)
    busy = create_session(alice_api)
    append_events(alice_api, session_id=idle, events=coding_turns(count=6))
    append_events(alice_api, session_id=busy, events=coding_turns(count=6))
    pending = CompactionRun.objects.create(
        session_id=busy, strategy="summarize", trigger="manual", summarizer="local"
    )
    client = Client()
    client.force_login(admin_user)
    response = client.post(
        "/admin/sessions_app/session/",
        {"action": "compact_now", "_selected_action": [idle, busy]},
        follow=True,
    )
    assert response.status_code == 200
    notices = [str(m) for m in response.context["messages"]]
    assert any("Started 1 compaction(s) for 2 session(s)" in n for n in notices), notices
    runs = _runs(alice_api, idle)
    assert len(runs) == 1 and runs[0]["trigger"] == "manual"
    assert wait_for_run(alice_api, run_id=runs[0]["id"])["status"] == "completed"
    assert CompactionRun.objects.get(pk=runs[0]["id"]).requested_by == admin_user
    assert list(CompactionRun.objects.filter(session_id=busy)) == [pending]
