"""Realtime messages are declared once (compaction_app/realtime/messages.py): every message a
run, a revert, an append and a gateway compaction push is one of the declared types with its
declared fields, nothing else builds one, and docs/api.md's table is the module's."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from compaction_app.realtime import messages

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.profile_independent
def test_it_documents_exactly_the_declared_messages():
    text = (ROOT / "docs" / "api.md").read_text()
    found = re.search(r"<!-- messages: begin -->\n(.*?)\n<!-- messages: end -->", text, re.S)
    assert found is not None, "docs/api.md has no message table"
    assert found.group(1).strip() == messages.table(), (
        "docs/api.md's message table is stale: paste `python -m compaction_app.realtime.messages`"
    )


@pytest.mark.profile_independent
def test_it_builds_messages_only_in_the_messages_module():
    """No other module writes a message literal: each is a model of messages.py."""
    names = "|".join(messages.type_name(model) for model in messages.MESSAGE_TYPES)
    literal = re.compile(rf"""["']type["']\s*:\s*["']({names})["']""")
    offenders = [
        str(path.relative_to(ROOT))
        for folder in ("compaction_app", "sessions_app", "config")
        for path in (ROOT / folder).rglob("*.py")
        if path.name != "messages.py" and literal.search(path.read_text())
    ]
    assert offenders == []


@pytest.mark.profile_independent
def test_it_refuses_a_message_with_a_missing_or_unknown_field():
    with pytest.raises(ValidationError):
        messages.parse({"type": "COMPACTION_REVERTED", "sessionId": "s", "compactionId": "c"})
    with pytest.raises(ValidationError):
        messages.parse({"type": "CONTEXT_COMPRESSED", "sessionId": "s", "originalTokenCount": 2,
                        "compressedTokenCount": 1, "surprise": True})  # fmt: skip
    with pytest.raises(ValidationError):
        messages.parse({"type": "NOT_A_MESSAGE"})
    assert isinstance(messages.parse({"type": "pong"}), messages.Pong)


def test_it_sends_only_declared_messages_through_a_run_and_a_revert(alice, alice_api, worker):
    """What a real run, revert and append push over the API's websocket validates against
    its declared model, field for field."""
    from asgiref.sync import async_to_sync, sync_to_async
    from channels.testing import WebsocketCommunicator

    from config.asgi import application
    from tests.support.helpers import (
        api_token,
        append_events,
        coding_turns,
        compact_and_wait,
        grown_session,
    )

    session_id = grown_session(alice_api, events=coding_turns(count=6))
    token = api_token(alice)

    async def scenario() -> list[dict]:
        communicator = WebsocketCommunicator(
            application, f"/ws/sessions/{session_id}/?token={token}"
        )
        connected, _ = await communicator.connect()
        assert connected
        run = await sync_to_async(compact_and_wait)(alice_api, session_id=session_id)
        reverted = await sync_to_async(alice_api.post)(f"/api/v1/compactions/{run['id']}/revert")
        assert reverted.status_code == 200, reverted.content
        await sync_to_async(append_events)(
            alice_api, session_id=session_id, events={"type": "USER_MESSAGE", "content": "go"}
        )
        received = []
        # (A receive that times out would cancel the consumer: ask whether one is waiting.)
        while not await communicator.receive_nothing(timeout=2):
            received.append(await communicator.receive_json_from(timeout=5))
        await communicator.disconnect()
        return received

    received = async_to_sync(scenario)()
    kinds = [m["type"] for m in received]
    for kind in ("COMPACTION_START", "COMPACTION_COMPLETE", "COMPACTION_REVERTED", "USAGE_UPDATED"):
        assert kind in kinds
    for message in received:
        assert messages.parse(message).to_json() == message
    usage = alice_api.get(f"/api/v1/sessions/{session_id}/usage").json()
    last_usage = [m for m in received if m["type"] == "USAGE_UPDATED"][-1]["usage"]
    assert last_usage == usage
