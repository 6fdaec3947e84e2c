"""End to end: API request → Celery worker thread → channel layer → websocket consumer."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync, sync_to_async

from tests.support.helpers import (
    api_token,
    coding_turns,
    grown_session,
    receive_until,
    ws_communicator,
)


@pytest.mark.django_db(transaction=True)
def test_it_runs_a_summarize_compaction_and_pushes_start_and_complete(worker, alice, alice_api):
    session_id = grown_session(
        alice_api,
        events=coding_turns(
            count=12, numbered_results=False, agent_note="Decided to use a dict lookup."
        ),
    )
    before = alice_api.get(f"/api/v1/sessions/{session_id}/usage").json()
    token = api_token(alice)

    async def scenario():
        communicator = ws_communicator(f"/ws/sessions/{session_id}/", token=token)
        connected, _ = await communicator.connect()
        assert connected
        response = await sync_to_async(alice_api.post)(
            f"/api/v1/sessions/{session_id}/compactions", {"strategy": "summarize"}, format="json"
        )
        assert response.status_code == 202, response.json()
        start = await receive_until(communicator, wanted="COMPACTION_START")
        complete = await receive_until(communicator, wanted="COMPACTION_COMPLETE")
        usage = await receive_until(communicator, wanted="USAGE_UPDATED")
        await communicator.disconnect()
        return response.json(), start, complete, usage

    run, start, complete, usage = async_to_sync(scenario)()
    assert start["compactionId"] == run["id"] and start["trigger"] == "manual"
    assert complete["success"] is True, complete
    assert complete["tokensBefore"] == before["contextTokens"]
    assert complete["tokensAfter"] < complete["tokensBefore"]
    assert complete["message"].startswith("Compaction complete! ")
    assert usage["usage"]["contextTokens"] == complete["tokensAfter"]
    stored = alice_api.get(f"/api/v1/compactions/{run['id']}").json()
    assert stored["status"] == "completed"
    summary = alice_api.get(f"/api/v1/sessions/{session_id}/summary").json()
    assert summary["summarizedMessageIds"]
    context = alice_api.get(f"/api/v1/sessions/{session_id}/context").json()
    assert context["tokenCount"] == complete["tokensAfter"]
    assert context["summary"]

    reverted = alice_api.post(f"/api/v1/compactions/{run['id']}/revert")
    assert reverted.status_code == 200, reverted.json()
    after_revert = alice_api.get(f"/api/v1/sessions/{session_id}/usage").json()
    assert after_revert["contextTokens"] == before["contextTokens"]
