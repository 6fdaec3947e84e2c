"""A provider usage without its total counts prompt + completion as its total: in the stored
event, in the session's totalTokens, and in events stored before this rule (the migration)."""

from __future__ import annotations

import importlib

from django.apps import apps

from sessions_app.models import Event, Session
from tests.support.helpers import create_session

fill = importlib.import_module("sessions_app.migrations.0009_total_tokens").fill_totals


def test_it_counts_a_missing_total_as_prompt_plus_completion(alice_api):
    session_id = create_session(alice_api)
    response = alice_api.post(
        f"/api/v1/sessions/{session_id}/events",
        [
            {"type": "USER_MESSAGE", "content": "list the files"},
            {
                "type": "AGENT_MESSAGE",
                "content": "a.py and b.py",
                "tokenUsage": {"promptTokens": 40, "completionTokens": 6},
            },
        ],
        format="json",
    )
    assert response.status_code == 201, response.content
    assert response.json()[1]["tokenUsage"]["totalTokens"] == 46
    usage = alice_api.get(f"/api/v1/sessions/{session_id}/usage").json()
    assert (usage["totalPromptTokens"], usage["totalCompletionTokens"]) == (40, 6)
    assert usage["totalTokens"] == 46


def test_it_refuses_a_missing_total_whose_parts_exceed_the_bound(alice_api):
    session_id = create_session(alice_api)
    usage = {"promptTokens": 10**12, "completionTokens": 1}
    response = alice_api.post(
        f"/api/v1/sessions/{session_id}/events",
        {"type": "AGENT_MESSAGE", "content": "x", "tokenUsage": usage},
        format="json",
    )
    assert response.status_code == 400
    assert response.json()["error"] == "invalid_request"
    assert not Event.objects.filter(session_id=session_id, type="AGENT_MESSAGE").exists()


def test_it_fills_the_totals_of_events_stored_before(alice_api):
    session_id = create_session(alice_api)
    alice_api.post(
        f"/api/v1/sessions/{session_id}/events",
        [
            {
                "type": "AGENT_MESSAGE",
                "content": "a",
                "tokenUsage": {"promptTokens": 40, "completionTokens": 6},
            },
            {
                "type": "AGENT_MESSAGE",
                "content": "b",
                "tokenUsage": {"promptTokens": 9, "totalTokens": 12},
            },
        ],
        format="json",
    )
    # As the old rule stored them: no total, and the counter without it.
    Event.objects.filter(session_id=session_id, content="a").update(total_tokens=None)
    Session.objects.filter(pk=session_id).update(reported_total_tokens=12)
    fill(apps, None)
    assert Event.objects.get(session_id=session_id, content="a").total_tokens == 46
    assert Session.objects.get(pk=session_id).reported_total_tokens == 58
