"""The loss report of a compaction run: the evidence its folded events held, what the new
context still holds, and what it dropped (API, websocket, dashboard panel)."""

from __future__ import annotations

import re

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.test import Client

from tests.support.helpers import (
    all_events,
    api_token,
    append_events,
    compact_and_wait,
    create_session,
    receive_until,
    ws_communicator,
)


def evidence_turns(count: int) -> list[dict]:
    """Shell turns whose tool output carries a distinct commit, exit code and error code."""
    events: list[dict] = []
    for turn in range(count):
        commit = f"{turn:02d}ab{turn:02d}cd9e"
        events += [
            {"type": "USER_MESSAGE", "content": f"Deploy build {turn} to staging."},
            {
                "type": "TOOL_CALL",
                "name": "bash",
                "toolCallId": f"c{turn}",
                "content": f'{{"command": "./deploy.sh --build {turn}"}}',
            },
            {
                "type": "TOOL_RESULT",
                "name": "bash",
                "toolCallId": f"c{turn}",
                "content": (
                    f"$ git rev-parse HEAD\n{commit}\n$ ./deploy.sh --build {turn}\n"
                    + "uploading layer\n" * 30
                    + f'HTTP/1.1 429 Too Many Requests\n{{"code": "ERR_QUOTA_{turn}"}}\n'
                    f"exit status {turn % 7 + 1}"
                ),
            },
            {"type": "AGENT_MESSAGE", "content": f"Build {turn} was throttled; retrying later."},
        ]
    return events


def grown(api, **settings) -> str:
    session_id = create_session(api, limit=6000, **settings)
    append_events(api, session_id=session_id, events=evidence_turns(12))
    return session_id


def check_report(report: dict, *, session_events: list[dict]) -> None:
    assert set(report) == {
        "evidenceBefore",
        "evidenceKept",
        "keptPercent",
        "dropped",
        "droppedTotal",
        "droppedReachable",
    }
    assert 0 <= report["droppedReachable"] <= report["droppedTotal"]
    assert report["evidenceBefore"] == report["evidenceKept"] + report["droppedTotal"]
    assert report["keptPercent"] == round(
        100 * report["evidenceKept"] / report["evidenceBefore"], 1
    )
    folded_seqs = {e["seq"] for e in session_events if e.get("compactedBy")}
    for item in report["dropped"]:
        assert set(item) == {"kind", "text", "seq"}
        assert item["seq"] in folded_seqs


@pytest.mark.django_db(transaction=True)
def test_it_reports_what_a_trim_run_dropped_with_the_seq_of_each_item(worker, alice_api):
    session_id = grown(alice_api)
    run = compact_and_wait(alice_api, session_id=session_id, strategy="trim", targetRatio=0.3)
    assert run["status"] == "completed"
    report = alice_api.get(f"/api/v1/compactions/{run['id']}").json()["lossReport"]
    events = all_events(alice_api, session_id=session_id)
    check_report(report, session_events=events)
    # trim keeps no summary: the oldest turn's commit is gone, and the report says so.
    assert report["droppedTotal"] > 0
    assert report["keptPercent"] < 100
    first_result = next(e for e in events if e["type"] == "TOOL_RESULT")
    assert {"kind": "commit", "text": "00ab00cd9e", "seq": first_result["seq"]} in report["dropped"]


@pytest.mark.django_db(transaction=True)
def test_it_counts_what_the_summary_kept_and_sends_kept_percent_on_completion(
    worker, alice, alice_api
):
    session_id = grown(alice_api, maxSummaryTokens=1500)
    token = api_token(alice)

    async def scenario():
        feed = ws_communicator(f"/ws/sessions/{session_id}/", token=token)
        connected, _ = await feed.connect(timeout=5)
        assert connected
        response = await sync_to_async(alice_api.post)(
            f"/api/v1/sessions/{session_id}/compactions", {"strategy": "summarize"}, format="json"
        )
        assert response.status_code == 202
        complete = await receive_until(feed, wanted="COMPACTION_COMPLETE", session_id=session_id)
        await feed.disconnect()
        return complete

    complete = async_to_sync(scenario)()
    assert complete["success"] is True
    run = alice_api.get(f"/api/v1/compactions/{complete['compactionId']}").json()
    report = run["lossReport"]
    check_report(report, session_events=all_events(alice_api, session_id=session_id))
    assert complete["keptPercent"] == report["keptPercent"]
    # The summary kept evidence a trim would have dropped: what went wrong (the error codes of
    # the outputs the agent reacted to). A commit nobody refers to is an id like any other.
    summary = alice_api.get(f"/api/v1/sessions/{session_id}/summary").json()["summary"]
    assert "ERR_QUOTA_0" in summary
    assert "ERR_QUOTA_8" in summary
    assert report["evidenceKept"] > 0
    # Most of it is present (the commits nobody referred to are ids like any other and go),
    # and what went is reachable: the summary cites every event it folded.
    assert report["keptPercent"] >= 50
    assert report["droppedReachable"] == report["droppedTotal"]


@pytest.mark.django_db(transaction=True)
def test_it_cites_the_seqs_of_the_folded_events_on_every_summary_line(worker, alice_api):
    session_id = grown(alice_api, maxSummaryTokens=800)
    run = compact_and_wait(alice_api, session_id=session_id, strategy="summarize")
    assert run["status"] == "completed"
    summary = alice_api.get(f"/api/v1/sessions/{session_id}/summary").json()["summary"]
    folded = {
        e["seq"] for e in all_events(alice_api, session_id=session_id) if e.get("compactedBy")
    }
    bullets = [line for line in summary.splitlines() if line.startswith("- ")]
    assert bullets
    for line in bullets:
        match = re.search(r"\[#(\d+)(?:-#(\d+))?\]$", line)
        assert match, line
        assert int(match.group(1)) in folded
        assert int(match.group(2) or match.group(1)) in folded
    assert "None." not in summary


@pytest.mark.django_db(transaction=True)
def test_it_shows_what_the_compaction_dropped_on_the_session_page(worker, alice, alice_api):
    session_id = grown(alice_api)
    run = compact_and_wait(alice_api, session_id=session_id, strategy="trim", targetRatio=0.3)
    report = alice_api.get(f"/api/v1/compactions/{run['id']}").json()["lossReport"]
    browser = Client()
    browser.force_login(alice)
    page = browser.get(f"/sessions/{session_id}/").content.decode()
    assert "What this compaction dropped" in page
    assert f"{report['keptPercent']} %" in page
    item = report["dropped"][0]
    assert f'href="#event-{item["seq"]}"' in page
    assert f'id="event-{item["seq"]}"' in page  # the anchor the link jumps to


@pytest.mark.django_db
def test_it_has_no_loss_report_before_a_run_completes(alice_api):
    session_id = grown(alice_api)
    response = alice_api.post(
        f"/api/v1/sessions/{session_id}/compactions", {"strategy": "trim"}, format="json"
    )
    run = alice_api.get(f"/api/v1/compactions/{response.json()['id']}").json()
    assert run["status"] == "pending"
    assert run["lossReport"] is None
