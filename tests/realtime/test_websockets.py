"""Websockets: authentication and authorisation of `/ws/sessions/` and `/ws/sessions/{id}/`,
who receives which push, and the thread-safe in-memory channel layer.

Runs on both profiles: the in-memory layer (no env) and channels_redis (`REDIS_URL`). On Redis
other test processes may share the layer, so assertions about "nothing arrives" only look at
messages about this test's sessions (session ids are UUIDs, user ids are not unique across
test databases).
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.test import Client

from compaction_app.realtime.broadcast import user_group
from compaction_app.realtime.layers import ThreadSafeInMemoryChannelLayer
from tests.support.helpers import (
    api_token,
    append_events,
    coding_turns,
    compact_and_wait,
    create_session,
    grown_session,
    receive_until,
    ws_communicator,
)

QUIET_SECONDS = 0.5  # how long "nothing arrives" is watched for


def _new_session(api) -> str:
    return create_session(api, limit=100_000)


def _grown_session(api) -> str:
    return grown_session(
        api, events=coding_turns(count=12, numbered_results=False, agent_note="Used a dict lookup.")
    )


async def _close_code(communicator: WebsocketCommunicator) -> int | None:
    """The code the server closed with; consumers accept first so browsers see it."""
    connected, _ = await communicator.connect(timeout=5)
    assert connected, "refusals accept first, then close with a code"
    output = await communicator.receive_output(timeout=5)
    assert output["type"] == "websocket.close", output
    return output.get("code")


async def _connected(communicator: WebsocketCommunicator) -> bool:
    connected, _ = await communicator.connect(timeout=5)
    if not connected:
        return False
    # Still open: a ping is answered (a refused connection would have closed instead). A
    # push that was on its way when the socket joined the session's group (the last
    # broadcast of a run the test waited for, on a loaded machine) may come first: skipped.
    await communicator.send_json_to({"type": "ping"})
    return (await receive_until(communicator, wanted="pong", timeout=5)) == {"type": "pong"}


async def _drain(communicator, *, seconds: float = QUIET_SECONDS) -> list[dict[str, Any]]:
    """Every message that arrives within `seconds`. (A timed-out receive would cancel the
    application, so wait with receive_nothing and only read what is already there.)"""
    messages = []
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        if await communicator.receive_nothing(timeout=left):
            break
        messages.append(await communicator.receive_json_from(timeout=1))
    return messages


def _connects_to_both_feeds(session_id: str, **credentials: str) -> list[bool]:
    """Whether `/ws/sessions/` and the session's own feed each stay open with `credentials`."""

    async def scenario():
        results = []
        for path in ("/ws/sessions/", f"/ws/sessions/{session_id}/"):
            communicator = ws_communicator(path, **credentials)
            results.append(await _connected(communicator))
            await communicator.disconnect()
        return results

    return async_to_sync(scenario)()


def _about(messages: list[dict[str, Any]], *session_ids: str) -> list[dict[str, Any]]:
    return [m for m in messages if m.get("sessionId") in session_ids]


# --- authentication and authorisation ----------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_it_closes_an_anonymous_connection_with_4401(alice, alice_api):
    session_id = _new_session(alice_api)

    async def scenario():
        return (
            await _close_code(ws_communicator("/ws/sessions/")),
            await _close_code(ws_communicator(f"/ws/sessions/{session_id}/")),
        )

    assert async_to_sync(scenario)() == (4401, 4401)


@pytest.mark.django_db(transaction=True)
def test_it_closes_a_connection_with_a_bad_token_with_4401(alice, alice_api):
    session_id = _new_session(alice_api)

    async def scenario():
        return (
            await _close_code(ws_communicator("/ws/sessions/", token="not-a-token")),
            await _close_code(ws_communicator(f"/ws/sessions/{session_id}/", token="0" * 40)),
        )

    assert async_to_sync(scenario)() == (4401, 4401)


@pytest.mark.django_db(transaction=True)
def test_it_closes_another_users_session_with_4403(alice, bob, alice_api):
    session_id = _new_session(alice_api)
    bob_token = api_token(bob)

    async def scenario():
        return await _close_code(ws_communicator(f"/ws/sessions/{session_id}/", token=bob_token))

    assert async_to_sync(scenario)() == 4403


@pytest.mark.django_db(transaction=True)
def test_it_closes_an_unknown_session_with_4403(alice):
    token = api_token(alice)

    async def scenario():
        return await _close_code(
            ws_communicator("/ws/sessions/00000000-0000-4000-8000-000000000000/", token=token)
        )

    assert async_to_sync(scenario)() == 4403


@pytest.mark.django_db(transaction=True)
def test_it_connects_the_owner_with_a_token(alice, alice_api):
    session_id = _new_session(alice_api)
    token = api_token(alice)

    assert _connects_to_both_feeds(session_id, token=token) == [True, True]


@pytest.mark.django_db(transaction=True)
def test_it_connects_the_owner_with_the_dashboard_session_cookie(alice, alice_api):
    session_id = _new_session(alice_api)
    browser = Client()
    assert browser.login(username="alice", password="pw-alice")
    cookie = f"sessionid={browser.cookies['sessionid'].value}"

    assert _connects_to_both_feeds(session_id, cookie=cookie) == [True, True]


@pytest.mark.django_db(transaction=True)
def test_it_prefers_a_bad_token_over_a_good_cookie_and_refuses(alice, alice_api):
    # A client that sends a token means that identity; a wrong one must not fall back silently.
    session_id = _new_session(alice_api)
    browser = Client()
    browser.force_login(alice)
    cookie = f"sessionid={browser.cookies['sessionid'].value}"

    async def scenario():
        return await _close_code(
            ws_communicator(f"/ws/sessions/{session_id}/", token="wrong", cookie=cookie)
        )

    assert async_to_sync(scenario)() == 4401


@pytest.mark.django_db(transaction=True)
def test_it_connects_staff_to_any_session(alice, staff, alice_api):
    session_id = _new_session(alice_api)
    token = api_token(staff)

    async def scenario():
        communicator = ws_communicator(f"/ws/sessions/{session_id}/", token=token)
        connected = await _connected(communicator)
        await communicator.disconnect()
        return connected

    assert async_to_sync(scenario)() is True


# --- who receives what ---------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_it_pushes_usage_to_the_owner_and_staff_but_never_to_another_user(
    alice, bob, staff, alice_api, bob_api
):
    alice_session = _new_session(alice_api)
    bob_session = _new_session(bob_api)
    tokens = {
        name: api_token(user) for name, user in (("alice", alice), ("bob", bob), ("staff", staff))
    }

    async def scenario():
        feeds = {name: ws_communicator("/ws/sessions/", token=key) for name, key in tokens.items()}
        for feed in feeds.values():
            assert await _connected(feed)

        await sync_to_async(append_events)(
            alice_api, session_id=alice_session, events={"type": "USER_MESSAGE", "content": "hi"}
        )
        to_alice = await receive_until(
            feeds["alice"], wanted="USAGE_UPDATED", session_id=alice_session
        )
        to_staff = await receive_until(
            feeds["staff"], wanted="USAGE_UPDATED", session_id=alice_session
        )
        bob_saw = _about(await _drain(feeds["bob"]), alice_session)

        await sync_to_async(append_events)(
            bob_api, session_id=bob_session, events={"type": "USER_MESSAGE", "content": "yo"}
        )
        to_bob = await receive_until(feeds["bob"], wanted="USAGE_UPDATED", session_id=bob_session)
        staff_bob = await receive_until(
            feeds["staff"], wanted="USAGE_UPDATED", session_id=bob_session
        )
        alice_saw = _about(await _drain(feeds["alice"]), bob_session)

        for feed in feeds.values():
            await feed.disconnect()
        return to_alice, to_staff, bob_saw, to_bob, staff_bob, alice_saw

    to_alice, to_staff, bob_saw, to_bob, staff_bob, alice_saw = async_to_sync(scenario)()
    assert to_alice == to_staff
    assert to_bob == staff_bob
    assert bob_saw == []
    assert alice_saw == []


@pytest.mark.django_db(transaction=True)
def test_it_pushes_usage_once_per_append_request_equal_to_the_usage_endpoint(alice, alice_api):
    session_id = _new_session(alice_api)
    token = api_token(alice)
    bulk = [{"type": "USER_MESSAGE", "content": f"message {i}"} for i in range(10)]

    async def scenario():
        communicator = ws_communicator(f"/ws/sessions/{session_id}/", token=token)
        assert await _connected(communicator)
        stored = await sync_to_async(append_events)(alice_api, session_id=session_id, events=bulk)
        after_bulk = _about(await _drain(communicator, seconds=1.0), session_id)
        usage = (await sync_to_async(alice_api.get)(f"/api/v1/sessions/{session_id}/usage")).json()
        await sync_to_async(append_events)(
            alice_api, session_id=session_id, events={"type": "AGENT_MESSAGE", "content": "ok"}
        )
        after_single = _about(await _drain(communicator, seconds=1.0), session_id)
        await communicator.disconnect()
        return stored, after_bulk, usage, after_single

    stored, after_bulk, usage, after_single = async_to_sync(scenario)()
    assert len(stored) == 10
    assert [m["type"] for m in after_bulk] == ["USAGE_UPDATED"]
    assert after_bulk[0]["usage"] == usage
    assert after_bulk[0]["sessionId"] == session_id
    assert [m["type"] for m in after_single] == ["USAGE_UPDATED"]
    assert after_single[0]["usage"]["contextTokens"] > usage["contextTokens"]


# --- compaction pushes ---------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_it_pushes_compaction_start_then_complete_to_the_session_feed(worker, alice, alice_api):
    session_id = _grown_session(alice_api)
    token = api_token(alice)

    async def scenario():
        feed = ws_communicator(f"/ws/sessions/{session_id}/", token=token)
        assert await _connected(feed)
        response = await sync_to_async(alice_api.post)(
            f"/api/v1/sessions/{session_id}/compactions", {"strategy": "summarize"}, format="json"
        )
        assert response.status_code == 202, response.json()
        pushed = []
        while not pushed or pushed[-1]["type"] != "USAGE_UPDATED":
            message = await feed.receive_json_from(timeout=20)
            if message.get("sessionId") == session_id:
                pushed.append(message)
        await feed.disconnect()
        return response.json(), pushed

    run, pushed = async_to_sync(scenario)()
    assert [m["type"] for m in pushed] == [
        "COMPACTION_START",
        "COMPACTION_COMPLETE",
        "USAGE_UPDATED",
    ]
    start, complete, usage = pushed
    assert start["compactionId"] == complete["compactionId"] == run["id"]
    assert start["strategy"] == "summarize" and start["trigger"] == "manual"
    assert complete["success"] is True and complete["error"] is None
    assert complete["tokensAfter"] < complete["tokensBefore"]
    assert complete["eventsAfter"] < complete["eventsBefore"]
    assert complete["message"] == (
        f"Compaction complete! {complete['tokensBefore']:,} → {complete['tokensAfter']:,} tokens "
        f"({round(100 * (1 - complete['tokensAfter'] / complete['tokensBefore']))}% reduction), "
        f"{complete['eventsBefore'] - complete['eventsAfter'] + 1} events folded"
    )
    assert usage["usage"]["contextTokens"] == complete["tokensAfter"]


@pytest.mark.django_db(transaction=True)
def test_it_pushes_compaction_reverted_with_context_tokens_before_and_after(
    worker, alice, alice_api
):
    session_id = _grown_session(alice_api)
    run = compact_and_wait(alice_api, session_id=session_id)
    assert run["status"] == "completed"
    token = api_token(alice)

    async def scenario():
        feed = ws_communicator(f"/ws/sessions/{session_id}/", token=token)
        assert await _connected(feed)
        response = await sync_to_async(alice_api.post)(f"/api/v1/compactions/{run['id']}/revert")
        assert response.status_code == 200, response.json()
        reverted = await receive_until(feed, wanted="COMPACTION_REVERTED", session_id=session_id)
        usage = await receive_until(feed, wanted="USAGE_UPDATED", session_id=session_id)
        await feed.disconnect()
        return reverted, usage

    reverted, usage = async_to_sync(scenario)()
    assert reverted == {
        "type": "COMPACTION_REVERTED",
        "sessionId": session_id,
        "compactionId": run["id"],
        "tokensBefore": run["tokensAfter"],
        "tokensAfter": usage["usage"]["contextTokens"],
    }
    # Nothing was appended since the run: the revert restores the context it started from.
    assert reverted["tokensAfter"] == run["tokensBefore"]


@pytest.mark.django_db(transaction=True)
def test_it_pushes_a_failed_completion_when_the_summarizer_fails(
    worker, alice, alice_api, settings
):
    settings.OPENAI_API_KEY = ""
    settings.OPENAI_BASE_URL = ""
    session_id = _grown_session(alice_api)
    before = alice_api.get(f"/api/v1/sessions/{session_id}/usage").json()
    token = api_token(alice)

    async def scenario():
        feed = ws_communicator(f"/ws/sessions/{session_id}/", token=token)
        assert await _connected(feed)
        response = await sync_to_async(alice_api.post)(
            f"/api/v1/sessions/{session_id}/compactions",
            {"strategy": "summarize", "summarizer": "openai"},
            format="json",
        )
        assert response.status_code == 202, response.json()
        start = await receive_until(feed, wanted="COMPACTION_START", session_id=session_id)
        complete = await receive_until(feed, wanted="COMPACTION_COMPLETE", session_id=session_id)
        await feed.disconnect()
        return response.json(), start, complete

    run, start, complete = async_to_sync(scenario)()
    assert start["compactionId"] == complete["compactionId"] == run["id"]
    assert complete["success"] is False
    assert complete["error"] and "no API key" in complete["error"]
    assert complete["message"].startswith("Compaction failed:")
    assert alice_api.get(f"/api/v1/compactions/{run['id']}").json()["status"] == "failed"
    after = alice_api.get(f"/api/v1/sessions/{session_id}/usage").json()
    assert after["contextTokens"] == before["contextTokens"]


# --- the thread-safe in-memory layer -------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_it_delivers_a_group_send_from_another_threads_loop_promptly(alice):
    layer = get_channel_layer()
    if not isinstance(layer, ThreadSafeInMemoryChannelLayer):
        pytest.skip("only the embedded profile's in-memory layer needs to cross event loops")
    token = api_token(alice)
    message = {"type": "ledger.message", "message": {"type": "PING", "sessionId": "x"}}

    sent_at: list[float] = []

    def send_from_worker_thread() -> None:
        # Let the server loop go idle in its selector first: a send that lands while the loop
        # is busy anyway would be picked up even without the cross-loop hand-off.
        time.sleep(0.2)
        sent_at.append(time.monotonic())
        # What a Celery worker thread does: async_to_sync runs the send in its own fresh loop.
        asyncio.run(layer.group_send(user_group(alice.pk), message))

    async def scenario():
        feed = ws_communicator("/ws/sessions/", token=token)
        assert await _connected(feed)  # the consumer now waits on its channel in this loop
        thread = threading.Thread(target=send_from_worker_thread)
        thread.start()
        received = await feed.receive_json_from(timeout=5)
        elapsed = time.monotonic() - sent_at[0]
        thread.join(timeout=5)
        await feed.disconnect()
        return received, elapsed

    received, elapsed = async_to_sync(scenario)()
    assert received == {"type": "PING", "sessionId": "x"}
    assert elapsed < 1.0


def test_it_wakes_a_receiver_in_another_loop_without_a_consumer():
    # Channels' own InMemoryChannelLayer fails this: the put from the other thread does not
    # wake the receiving loop, which sees the message only when it next wakes up (here: at
    # the 5 s timeout).
    layer = ThreadSafeInMemoryChannelLayer()
    sent_at: list[float] = []

    def worker() -> None:
        time.sleep(0.2)  # the receiving loop is idle in its selector by now
        sent_at.append(time.monotonic())
        asyncio.run(layer.group_send("ledger.test", {"type": "x.y", "n": 1}))

    async def scenario():
        channel = await layer.new_channel()
        await layer.group_add("ledger.test", channel)
        receiving = asyncio.ensure_future(layer.receive(channel))
        thread = threading.Thread(target=worker)
        thread.start()
        message = await asyncio.wait_for(receiving, timeout=5)
        elapsed = time.monotonic() - sent_at[0]
        thread.join(timeout=5)
        await layer.group_discard("ledger.test", channel)
        return message, elapsed, dict(layer.groups), dict(layer._receiver_loops)

    message, elapsed, groups, loops = asyncio.run(scenario())
    assert message == {"type": "x.y", "n": 1}
    assert elapsed < 1.0
    assert groups == {} and loops == {}  # nothing kept for a channel that left its groups


def test_it_keeps_group_sends_safe_while_another_thread_joins_groups():
    # The worker thread's group_send iterates the group tables while the server loop adds
    # connections to them; unguarded, that is "dictionary changed size during iteration"
    # (the broadcast is then lost). A tiny switch interval makes the interleaving near certain.
    layer = ThreadSafeInMemoryChannelLayer(capacity=100_000)
    errors: list[BaseException] = []
    count = 1000

    def sender() -> None:
        async def send_many() -> None:
            for _ in range(count):
                await layer.group_send("ledger.busy", {"type": "x.y"})

        try:
            asyncio.run(send_many())
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    async def join_many() -> None:
        for i in range(count):
            await layer.group_add(f"ledger.g{i}", f"specific.inmemory!c{i}")
            if i % 100 == 0:
                await layer.group_add("ledger.busy", f"specific.inmemory!c{i}")

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        thread = threading.Thread(target=sender)
        thread.start()
        asyncio.run(join_many())
        thread.join(timeout=30)
    finally:
        sys.setswitchinterval(interval)
    assert errors == []
