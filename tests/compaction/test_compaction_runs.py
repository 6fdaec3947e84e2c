"""Compaction runs end to end: API → Celery worker thread → stored events, counters, summary."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest

from compaction_app import services
from compaction_app.models import CompactionRun
from compaction_app.signals import memory_flush
from compaction_app.tasks import run_compaction
from compaction_app.testkit.provider_standin import reply_text
from sessions_app.models import Event, Session
from tests.support.helpers import (
    SYSTEM_PROMPT,
    all_events,
    append_events,
    coding_turns,
    compact_and_wait,
    compaction_marker,
    create_session,
    fake_openai,
)

pytestmark = pytest.mark.django_db(transaction=True)

# --- helpers ---------------------------------------------------------------------------------


def _turns(start: int, count: int) -> list[dict[str, Any]]:
    return coding_turns(start=start, count=count, agent_note="Decided to use a dict lookup.")


def _assert_tool_pairs_intact(messages: list[dict[str, Any]]) -> None:
    calls = {
        call["id"]: index
        for index, message in enumerate(messages)
        for call in message.get("tool_calls") or []
    }
    results = {m["tool_call_id"]: i for i, m in enumerate(messages) if m["role"] == "tool"}
    assert set(calls) == set(results), (sorted(calls), sorted(results))
    assert all(calls[key] < index for key, index in results.items())


def _assert_counters_match_recount(api, session_id: str) -> dict[str, Any]:
    session = Session.objects.get(pk=session_id)
    stored = list(Event.objects.filter(session=session))
    active = list(Event.objects.filter(session=session).active())
    active_tokens = sum(e.effective_token_count for e in active)
    assert session.event_count == len(stored)
    assert session.last_seq == len(stored)
    assert session.ledger_tokens == sum(e.token_count for e in stored)
    assert session.active_event_count == len(active)
    assert session.active_tokens == active_tokens
    usage = api.get(f"/api/v1/sessions/{session_id}/usage").json()
    assert usage["contextTokens"] == (active_tokens + 3 if active else 0)
    return usage


def _check_kept_context(api, session_id: str, *, last_user: str) -> list[dict[str, Any]]:
    context = api.get(f"/api/v1/sessions/{session_id}/context").json()
    messages = context["messages"]
    assert messages[0] == {"role": "system", "content": SYSTEM_PROMPT}
    users = [m["content"] for m in messages if m["role"] == "user"]
    assert users[-1] == last_user
    _assert_tool_pairs_intact(messages)
    return messages


# --- strategies end to end -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("strategy", "limit"),
    [("summarize", 4000), ("trim", 3000), ("clear_tool_results", 4000)],
)
def test_it_runs_each_strategy_end_to_end_keeping_what_must_stay(
    worker, alice_api, strategy, limit
):
    session_id = create_session(alice_api, limit=limit)
    stored = append_events(alice_api, session_id=session_id, events=_turns(0, 12))
    # Pin an old agent message every strategy would otherwise fold (clear leaves it anyway).
    pinned = stored[3]
    assert pinned["type"] == "AGENT_MESSAGE"
    response = alice_api.patch(
        f"/api/v1/sessions/{session_id}/events/{pinned['id']}", {"pinned": True}, format="json"
    )
    assert response.status_code == 200 and response.json()["pinned"] is True
    before = alice_api.get(f"/api/v1/sessions/{session_id}/usage").json()

    run = compact_and_wait(alice_api, session_id=session_id, strategy=strategy)

    assert run["status"] == "completed", run
    assert run["strategy"] == strategy and run["trigger"] == "manual"
    assert run["tokensBefore"] == before["contextTokens"]
    assert run["tokensAfter"] < run["tokensBefore"]
    usage = _assert_counters_match_recount(alice_api, session_id)
    assert run["tokensAfter"] == usage["contextTokens"]
    assert run["eventsAfter"] == Session.objects.get(pk=session_id).active_event_count
    messages = _check_kept_context(alice_api, session_id, last_user=stored[-4]["content"])
    assert any(m.get("content") == pinned["content"] for m in messages)

    # Nothing is ever deleted: every stored event is still listed, folded ones marked.
    events = all_events(alice_api, session_id=session_id)
    by_id = {e["id"]: e for e in events}
    assert {e["id"] for e in stored} <= set(by_id)
    assert by_id[pinned["id"]]["compactedBy"] is None
    assert by_id[stored[-4]["id"]]["compactedBy"] is None
    marker = compaction_marker(events, run_id=run["id"])
    folded = [e for e in events if e["compactedBy"] == marker["id"]]
    assert all(e["compactedBy"] in (None, marker["id"]) for e in events)
    if strategy == "clear_tool_results":
        assert folded == []
        assert any(e["cleared"] for e in events)
        cleared = [m for m in messages if m["role"] == "tool" and "cleared" in m["content"]]
        assert cleared and all("read_file" in m["content"] for m in cleared)
    else:
        assert folded
        # A folded tool call's results are folded by the same run, and vice versa.
        calls = {e["toolCallId"] for e in folded if e["type"] in ("TOOL_CALL", "TOOL_RESULT")}
        for event in events:
            if event["toolCallId"] in calls:
                assert event["compactedBy"] == marker["id"], event
    if strategy == "summarize":
        users = [e for e in events if e["type"] == "USER_MESSAGE"]
        assert all(e["compactedBy"] is None for e in users)
        assert alice_api.get(f"/api/v1/sessions/{session_id}/summary").status_code == 200


def test_it_logs_context_compressed_with_both_token_counts(worker, alice_api, caplog):
    caplog.set_level(logging.INFO, logger="context")
    session_id = create_session(alice_api)
    append_events(alice_api, session_id=session_id, events=_turns(0, 12))
    run = compact_and_wait(alice_api, session_id=session_id)
    assert run["status"] == "completed"
    deadline = time.monotonic() + 5
    while True:
        records = [
            r
            for r in caplog.records
            if r.name == "context" and r.getMessage().startswith("context:compressed")
        ]
        if records or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert len(records) == 1
    record = records[0]
    assert record.originalTokenCount == run["tokensBefore"]
    assert record.compressedTokenCount == run["tokensAfter"]
    assert f"'originalTokenCount': {run['tokensBefore']}" in record.getMessage()
    assert f"'compressedTokenCount': {run['tokensAfter']}" in record.getMessage()


def test_it_extends_the_running_summary_incrementally(worker, alice_api):
    session_id = create_session(alice_api)
    append_events(alice_api, session_id=session_id, events=_turns(0, 10))
    first = compact_and_wait(alice_api, session_id=session_id)
    assert first["status"] == "completed"
    summary1 = alice_api.get(f"/api/v1/sessions/{session_id}/summary").json()
    assert summary1["summarizedMessageIds"]

    new_events = append_events(alice_api, session_id=session_id, events=_turns(10, 10))
    second = compact_and_wait(alice_api, session_id=session_id)
    assert second["status"] == "completed"
    summary2 = alice_api.get(f"/api/v1/sessions/{session_id}/summary").json()

    ids1, ids2 = summary1["summarizedMessageIds"], summary2["summarizedMessageIds"]
    assert ids2[: len(ids1)] == ids1 and len(ids2) > len(ids1)
    assert len(set(ids2)) == len(ids2)
    events = all_events(alice_api, session_id=session_id)
    marker1, marker2 = (
        compaction_marker(events, run_id=first["id"]),
        compaction_marker(events, run_id=second["id"]),
    )
    # The new ids are exactly the messages the second run folded (its predecessor's
    # COMPACTION event aside), in order.
    folded2 = [
        e["id"] for e in events if e["compactedBy"] == marker2["id"] and e["type"] != "COMPACTION"
    ]
    assert ids2[len(ids1) :] == folded2
    assert {e["id"] for e in new_events} & set(folded2)
    assert summary2["lastSummarizedMessageId"] != summary1["lastSummarizedMessageId"]
    assert summary2["lastSummarizedMessageId"] == ids2[-1]
    assert marker1["compactedBy"] == marker2["id"]
    assert marker2["content"] == summary2["summary"]
    context = alice_api.get(f"/api/v1/sessions/{session_id}/context").json()
    assert context["summary"] == summary2["summary"]
    assert sum(1 for m in context["messages"] if m["content"] == summary1["summary"]) == 0


def test_it_gives_the_summarizer_only_the_previous_summary_and_newly_folded_events(
    worker, alice_api, settings
):
    with fake_openai(settings) as fake:
        fake.script(reply_text("FIRST-SUMMARY bug fixes 0-9"), reply_text("SECOND-SUMMARY"))
        session_id = create_session(alice_api, summarizer="openai")
        old = append_events(alice_api, session_id=session_id, events=_turns(0, 10))
        first = compact_and_wait(alice_api, session_id=session_id)
        assert first["status"] == "completed", first
        new = append_events(alice_api, session_id=session_id, events=_turns(10, 10))
        second = compact_and_wait(alice_api, session_id=session_id)
        assert second["status"] == "completed", second
    assert len(fake.requests) == 2
    prompt = fake.requests[1].body["messages"][-1]["content"]
    previous = prompt.split("<previous_summary>")[1].split("</previous_summary>")[0]
    assert previous.strip() == "FIRST-SUMMARY bug fixes 0-9"
    messages = prompt.split("<messages>")[1]
    events = all_events(alice_api, session_id=session_id)
    marker1, marker2 = (
        compaction_marker(events, run_id=first["id"]),
        compaction_marker(events, run_id=second["id"]),
    )
    folded_first = [e for e in events if e["compactedBy"] == marker1["id"]]
    folded_now = [
        e for e in events if e["compactedBy"] == marker2["id"] and e["type"] != "COMPACTION"
    ]
    assert folded_first and folded_now
    assert {e["id"] for e in new} & {e["id"] for e in folded_now}
    for event in folded_now:
        if event["type"] != "TOOL_CALL":
            assert event["content"] in messages
    assert messages.count("\n[") == len(folded_now)  # one numbered entry per folded event
    for event in folded_first:
        if event["type"] == "AGENT_MESSAGE":
            assert event["content"] not in messages
    assert {e["id"] for e in old} >= {e["id"] for e in folded_first}
    assert alice_api.get(f"/api/v1/sessions/{session_id}/summary").json()["summary"] == (
        "SECOND-SUMMARY"
    )


def test_it_holds_the_stored_summary_to_max_summary_tokens_at_a_word_boundary(
    worker, alice_api, settings
):
    words = " ".join(f"word{n} alpha beta" for n in range(200))
    with fake_openai(settings, default=reply_text(words)):
        session_id = create_session(alice_api, summarizer="openai", maxSummaryTokens=16)
        append_events(alice_api, session_id=session_id, events=_turns(0, 10))
        run = compact_and_wait(alice_api, session_id=session_id)
    assert run["status"] == "completed", run
    summary = alice_api.get(f"/api/v1/sessions/{session_id}/summary").json()
    assert 0 < summary["tokenCount"] <= 16
    text = summary["summary"]
    assert text and words.startswith(text)
    assert words[len(text)] == " "  # cut between words, never inside one


def test_it_holds_the_local_summary_to_max_summary_tokens(worker, alice_api):
    session_id = create_session(alice_api, maxSummaryTokens=16)
    append_events(alice_api, session_id=session_id, events=_turns(0, 10))
    run = compact_and_wait(alice_api, session_id=session_id)
    assert run["status"] == "completed", run
    summary = alice_api.get(f"/api/v1/sessions/{session_id}/summary").json()
    assert 0 < summary["tokenCount"] <= 16
    assert summary["summary"] == summary["summary"].strip()


def _state(api, session_id: str) -> dict[str, Any]:
    usage = api.get(f"/api/v1/sessions/{session_id}/usage").json()
    summary = api.get(f"/api/v1/sessions/{session_id}/summary")
    return {
        "events": all_events(api, session_id=session_id),
        "usage": usage,
        "summary": summary.json() if summary.status_code == 200 else None,
        "runs": api.get(f"/api/v1/sessions/{session_id}/compactions").json(),
        "context": api.get(f"/api/v1/sessions/{session_id}/context").json(),
    }


def test_it_leaves_a_completed_run_alone_when_the_task_runs_again(worker, alice_api):
    session_id = create_session(alice_api)
    append_events(alice_api, session_id=session_id, events=_turns(0, 12))
    run = compact_and_wait(alice_api, session_id=session_id)
    assert run["status"] == "completed"
    before = _state(alice_api, session_id)

    services.compaction_execute(run_id=run["id"])
    services.compaction_execute(run_id=run["id"])
    result = run_compaction.apply(args=[run["id"]])
    assert result.get() == "completed"

    assert _state(alice_api, session_id) == before
    assert CompactionRun.objects.get(pk=run["id"]).attempts == 1


def test_it_applies_a_run_once_when_a_second_delivery_finishes_it_first(worker, alice_api):
    """acks_late may deliver a task again while the first delivery is still working. The
    memory_flush signal fires between a delivery's planning and its apply step: there the
    second delivery runs to completion, and the first must then apply nothing."""
    session_id = create_session(alice_api)
    append_events(alice_api, session_id=session_id, events=_turns(0, 12))
    session = Session.objects.get(pk=session_id)
    run = services.compaction_request(session=session, user=None, enqueue=False)
    deliveries: list[str] = []

    def second_delivery(sender, *, run_id, **kwargs):
        if not deliveries:
            deliveries.append("second")
            services.compaction_execute(run_id=run_id)

    memory_flush.connect(second_delivery, weak=False)
    try:
        first = services.compaction_execute(run_id=run.pk)
    finally:
        memory_flush.disconnect(second_delivery)
    assert deliveries == ["second"]
    assert first.status == "completed"
    assert Event.objects.filter(session=session, type="COMPACTION").count() == 1
    marker = Event.objects.get(session=session, type="COMPACTION")
    assert CompactionRun.objects.get(pk=run.pk).compaction_event_id == marker.pk
    assert (
        Event.objects.filter(session=session, compacted_by__isnull=False)
        .exclude(compacted_by=marker)
        .count()
        == 0
    )
    _assert_counters_match_recount(alice_api, session_id)


def test_it_reverts_the_latest_run_restoring_events_and_the_previous_summary(worker, alice_api):
    session_id = create_session(alice_api, limit=8000)
    append_events(alice_api, session_id=session_id, events=_turns(0, 10))
    original = alice_api.get(f"/api/v1/sessions/{session_id}/context").json()
    first = compact_and_wait(alice_api, session_id=session_id)
    append_events(alice_api, session_id=session_id, events=_turns(10, 10))
    between = _state(alice_api, session_id)
    second = compact_and_wait(alice_api, session_id=session_id)
    assert first["status"] == second["status"] == "completed"

    refused = alice_api.post(f"/api/v1/compactions/{first['id']}/revert")
    assert refused.status_code == 409
    assert refused.json()["error"] == "not_revertible"

    reverted = alice_api.post(f"/api/v1/compactions/{second['id']}/revert")
    assert reverted.status_code == 200, reverted.json()
    assert reverted.json()["revertedAt"]
    after = _state(alice_api, session_id)
    assert after["summary"]["summary"] == between["summary"]["summary"]
    assert after["summary"]["summarizedMessageIds"] == between["summary"]["summarizedMessageIds"]
    assert (
        after["summary"]["lastSummarizedMessageId"] == between["summary"]["lastSummarizedMessageId"]
    )
    assert after["summary"]["tokenCount"] == between["summary"]["tokenCount"]
    assert after["context"]["messages"] == between["context"]["messages"]
    assert after["usage"]["contextTokens"] == between["usage"]["contextTokens"]
    _assert_counters_match_recount(alice_api, session_id)
    # History is kept: the reverted run's COMPACTION event is still stored.
    assert len(after["events"]) == len(between["events"]) + 1
    again = alice_api.post(f"/api/v1/compactions/{second['id']}/revert")
    assert again.status_code == 409 and again.json()["error"] == "not_revertible"

    # Now the first run is the latest one standing: reverting it restores the original.
    assert alice_api.post(f"/api/v1/compactions/{first['id']}/revert").status_code == 200
    assert alice_api.get(f"/api/v1/sessions/{session_id}/summary").status_code == 404
    restored = alice_api.get(f"/api/v1/sessions/{session_id}/context").json()
    original_ids = [m["content"] for m in original["messages"]]
    assert [m["content"] for m in restored["messages"]][: len(original_ids)] == original_ids


def test_it_compacts_a_session_over_its_limit_in_summarizer_sized_pieces(
    worker, alice_api, settings
):
    settings.SUMMARIZER_WINDOW_TOKENS = 1500
    with fake_openai(settings) as fake:
        fake.script(*(reply_text(f"PIECE-{n} summary") for n in range(1, 20)))
        session_id = create_session(alice_api, limit=2000, summarizer="openai")
        append_events(alice_api, session_id=session_id, events=_turns(0, 16))
        before = alice_api.get(f"/api/v1/sessions/{session_id}/usage").json()
        assert before["contextTokens"] > before["contextLimit"]
        run = compact_and_wait(alice_api, session_id=session_id)
    assert run["status"] == "completed", run
    assert run["tokensAfter"] <= 2000
    assert len(fake.requests) >= 2
    from sessions_app.tokens import counter_for_model

    counter = counter_for_model("gpt-4o")
    for index, request in enumerate(fake.requests):
        prompt = request.body["messages"][-1]["content"]
        assert counter.count(prompt) <= 1500 + 200  # the window, plus the prompt's framing
        if index:
            assert f"PIECE-{index} summary" in prompt.split("</previous_summary>")[0]
    summary = alice_api.get(f"/api/v1/sessions/{session_id}/summary").json()
    assert summary["summary"] == f"PIECE-{len(fake.requests)} summary"
    assert alice_api.get(f"/api/v1/sessions/{session_id}/context").status_code == 200


def test_it_shows_a_revert_on_events_and_runs_and_names_the_revertible_run(worker, alice_api):
    session_id = create_session(alice_api, limit=8000)
    append_events(alice_api, session_id=session_id, events=_turns(0, 10))
    first = compact_and_wait(alice_api, session_id=session_id)
    append_events(alice_api, session_id=session_id, events=_turns(10, 10))
    second = compact_and_wait(alice_api, session_id=session_id)
    assert first["reverted"] is second["reverted"] is False

    refused = alice_api.post(f"/api/v1/compactions/{first['id']}/revert")
    assert refused.status_code == 409
    assert refused.json()["error"] == "not_revertible"
    assert refused.json()["revertibleCompactionId"] == second["id"]
    assert second["id"] in refused.json()["detail"]

    reverted = alice_api.post(f"/api/v1/compactions/{second['id']}/revert").json()
    assert reverted["reverted"] is True
    assert alice_api.get(f"/api/v1/compactions/{second['id']}").json()["reverted"] is True
    # The first run is now the one a revert may undo.
    again = alice_api.post(f"/api/v1/compactions/{second['id']}/revert").json()
    assert again["revertibleCompactionId"] == first["id"]

    listed = alice_api.get(f"/api/v1/sessions/{session_id}/events?limit=1000").json()["results"]
    assert all(e["reverted"] is False for e in listed)
    assert second["id"] not in {e["metadata"].get("compactionId") for e in listed}
    assert first["id"] in {e["metadata"].get("compactionId") for e in listed}
    marker = compaction_marker(all_events(alice_api, session_id=session_id), run_id=second["id"])
    assert marker["reverted"] is True and marker["content"]
