"""COMPACTION_PENDING: announced over the websocket when an append first pushes a session past
its compact threshold with auto compaction on, before the auto run starts."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.test import Client

from tests.support.helpers import (
    api_token,
    append_events,
    coding_turns,
    create_session,
    wait_for_run,
    ws_communicator,
)


def cookie_header(user) -> str:
    client = Client()
    client.force_login(user)
    client.get("/")  # sets the csrftoken cookie too
    return "; ".join(f"{name}={morsel.value}" for name, morsel in client.cookies.items())


def crossing(api, user, *, auto: bool) -> tuple[list[dict], str, float]:
    """Append until the context crosses 80 %, listening on the session's JSON feed and its
    dashboard feed; returns the JSON messages up to COMPACTION_START (or the first usage push
    after the crossing when no run starts), the dashboard frames, and percentUsed."""
    session_id = create_session(api, limit=2000, autoCompact=auto, cooldownSeconds=60)
    append_events(api, session_id=session_id, events=coding_turns(count=5))
    assert not api.get(f"/api/v1/sessions/{session_id}/usage").json()["nearLimit"]
    token = api_token(user)
    cookie = cookie_header(user)

    async def scenario():
        feed = ws_communicator(f"/ws/sessions/{session_id}/", token=token)
        page = ws_communicator(f"/ws/dashboard/sessions/{session_id}/", cookie=cookie)
        assert (await feed.connect(timeout=5))[0]
        assert (await page.connect(timeout=5))[0]
        await sync_to_async(append_events)(
            api, session_id=session_id, events=coding_turns(start=5, count=3)
        )
        messages = []
        while True:
            message = await feed.receive_json_from(timeout=20)
            messages.append(message)
            if message["type"] == "COMPACTION_START" or (
                not auto and message["type"] == "USAGE_UPDATED"
            ):
                break
        frames = []
        while not await page.receive_nothing(timeout=0.5):
            frames.append(await page.receive_from(timeout=5))
        await feed.disconnect()
        await page.disconnect()
        return messages, "".join(frames)

    messages, frames = async_to_sync(scenario)()
    usage = api.get(f"/api/v1/sessions/{session_id}/usage").json()
    return messages, frames, usage["percentUsed"]


@pytest.mark.django_db(transaction=True)
def test_it_announces_a_pending_auto_compaction_before_the_run_starts(worker, alice, alice_api):
    messages, frames, _ = crossing(alice_api, alice, auto=True)
    types = [m["type"] for m in messages]
    assert "COMPACTION_PENDING" in types
    assert types.index("COMPACTION_PENDING") < types.index("COMPACTION_START")
    pending = messages[types.index("COMPACTION_PENDING")]
    assert set(pending) == {"type", "sessionId", "percentUsed"}
    assert pending["sessionId"] == messages[-1]["sessionId"]
    assert pending["percentUsed"] >= 80
    # The dashboard shows it as a notice, so a user can pin what must stay.
    assert "an automatic compaction is about to start" in frames
    assert f"Context at {pending['percentUsed']} %" in frames


@pytest.mark.django_db(transaction=True)
def test_it_announces_nothing_when_auto_compaction_is_off(worker, alice, alice_api):
    messages, frames, percent = crossing(alice_api, alice, auto=False)
    assert percent >= 80
    assert "COMPACTION_PENDING" not in [m["type"] for m in messages]
    assert "about to start" not in frames


@pytest.mark.django_db(transaction=True)
def test_it_announces_once_per_auto_run_not_on_every_append(worker, alice, alice_api):
    # A window where one turn is a few percent, and no hard limit below 100 %: crossing the
    # compact threshold again stays a threshold crossing (the hard limit ignores the cooldown).
    session_id = create_session(
        alice_api, limit=6000, autoCompact=True, cooldownSeconds=60, hardLimitThreshold=1.0
    )
    usage_url = f"/api/v1/sessions/{session_id}/usage"
    turn = 0
    while not alice_api.get(usage_url).json()["nearLimit"]:
        append_events(alice_api, session_id=session_id, events=coding_turns(start=turn, count=1))
        turn += 1
    (first,) = alice_api.get(f"/api/v1/sessions/{session_id}/compactions").json()["results"]
    assert first["trigger"] == "auto"
    wait_for_run(alice_api, run_id=first["id"])
    token = api_token(alice)

    async def scenario():
        feed = ws_communicator(f"/ws/sessions/{session_id}/", token=token)
        assert (await feed.connect(timeout=5))[0]
        # Within the cooldown: the context crosses the threshold again; no run, no notice.
        nonlocal turn
        while not (await sync_to_async(alice_api.get)(usage_url)).json()["nearLimit"]:
            await sync_to_async(append_events)(
                alice_api, session_id=session_id, events=coding_turns(start=turn, count=1)
            )
            turn += 1
        seen = []
        while not await feed.receive_nothing(timeout=1.5):
            seen.append((await feed.receive_json_from(timeout=5))["type"])
        await feed.disconnect()
        return seen

    seen = async_to_sync(scenario)()
    assert "USAGE_UPDATED" in seen
    assert "COMPACTION_PENDING" not in seen
    assert not alice_api.get(usage_url).json()["atLimit"]
    runs = alice_api.get(f"/api/v1/sessions/{session_id}/compactions").json()["results"]
    assert [run["id"] for run in runs] == [first["id"]]
