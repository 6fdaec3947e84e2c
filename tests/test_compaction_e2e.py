"""End to end: API request → Celery worker thread → channel layer → websocket consumer."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.testing import WebsocketCommunicator
from rest_framework.authtoken.models import Token

from config.asgi import application


def _grow_session(api, *, turns: int = 12, limit: int = 4000) -> str:
    session = api.post(
        "/api/v1/sessions",
        {
            "model": "gpt-4o",
            "contextLimit": limit,
            "systemPrompt": "You are a coding agent.",
            "settings": {"autoCompact": False},
        },
        format="json",
    ).json()
    events = []
    for turn in range(turns):
        events += [
            {"type": "USER_MESSAGE", "content": f"Please fix bug {turn} in src/module_{turn}.py"},
            {
                "type": "TOOL_CALL",
                "name": "read_file",
                "toolCallId": f"c{turn}",
                "content": f'{{"path": "src/module_{turn}.py"}}',
            },
            {
                "type": "TOOL_RESULT",
                "toolCallId": f"c{turn}",
                "name": "read_file",
                "content": "def f():\n    return 1\n" * 20,
            },
            {
                "type": "AGENT_MESSAGE",
                "content": f"Fixed bug {turn}: KeyError in handler_{turn}. Decided to use a dict lookup.",
            },
        ]
    response = api.post(f"/api/v1/sessions/{session['id']}/events", events, format="json")
    assert response.status_code == 201, response.json()
    return session["id"]


async def _receive_until(communicator, wanted: str, *, timeout: float = 20):
    while True:
        message = await communicator.receive_json_from(timeout=timeout)
        if message["type"] == wanted:
            return message


@pytest.mark.django_db(transaction=True)
def test_it_runs_a_summarize_compaction_and_pushes_start_and_complete(worker, alice, alice_api):
    session_id = _grow_session(alice_api)
    before = alice_api.get(f"/api/v1/sessions/{session_id}/usage").json()
    token = Token.objects.get(user=alice).key

    async def scenario():
        communicator = WebsocketCommunicator(
            application,
            f"/ws/sessions/{session_id}/?token={token}",
            headers=[(b"origin", b"http://testserver")],
        )
        connected, _ = await communicator.connect()
        assert connected
        response = await sync_to_async(alice_api.post)(
            f"/api/v1/sessions/{session_id}/compactions", {"strategy": "summarize"}, format="json"
        )
        assert response.status_code == 202, response.json()
        start = await _receive_until(communicator, "COMPACTION_START")
        complete = await _receive_until(communicator, "COMPACTION_COMPLETE")
        usage = await _receive_until(communicator, "USAGE_UPDATED")
        await communicator.disconnect()
        return response.json(), start, complete, usage

    run, start, complete, usage = async_to_sync(scenario)()
    assert start["compactionId"] == run["id"] and start["trigger"] == "manual"
    assert complete["success"] is True, complete
    assert complete["tokensBefore"] == before["contextTokens"]
    assert complete["tokensAfter"] < complete["tokensBefore"]
    assert complete["message"].startswith("Compaction complete! Reduced from ")
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
