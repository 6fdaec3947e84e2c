"""Websockets one user may hold (WS_MAX_CONNECTIONS_PER_USER) and a clean refusal when the
channel layer's Redis cannot take a socket (issue 42, row 11: 3,000 sockets on one user's
token met no cap, 437 handshakes were answered 500 (`MaxConnectionsError` in `group_add`), and
on a full Redis every handshake was a 500). Runs on both profiles (the cap's slots in the
process's memory, or in Redis); the full Redis is a private redis-server."""

from __future__ import annotations

import asyncio
import shutil
import time

import pytest
import redis
from channels.testing import WebsocketCommunicator

from compaction_app.realtime import ws_limits
from tests.support.helpers import api_token, create_session, ws_communicator

pytestmark = pytest.mark.django_db(transaction=True)


async def _outcome(communicator: WebsocketCommunicator) -> int | None:
    """None: open (nothing came); else the code it was closed with after its accept."""
    connected, _ = await communicator.connect(timeout=5)
    assert connected, "refusals accept first, then close with a code"
    if await communicator.receive_nothing(timeout=0.3):
        return None
    output = await communicator.receive_output(timeout=5)
    assert output["type"] == "websocket.close", output
    return output.get("code")


def test_it_caps_one_users_websockets_and_frees_a_slot_when_one_closes(
    alice, alice_api, bob, bob_api, settings
):
    settings.WS_MAX_CONNECTIONS_PER_USER = 3
    alices, bobs_token = api_token(alice), api_token(bob)
    session_id = create_session(alice_api)
    bobs_session = create_session(bob_api)

    async def scenario() -> None:
        opened = [
            ws_communicator(f"/ws/sessions/{session_id}/", token=alices) for _ in range(2)
        ] + [ws_communicator("/ws/sessions/", token=alices)]
        for communicator in opened:
            assert await _outcome(communicator) is None
        # The fourth, on either path: 4429, whatever the token or cookie.
        for path in (f"/ws/sessions/{session_id}/", "/ws/sessions/"):
            assert await _outcome(ws_communicator(path, token=alices)) == 4429
        # Another user is not counted.
        bobs = ws_communicator(f"/ws/sessions/{bobs_session}/", token=bobs_token)
        assert await _outcome(bobs) is None
        # One closes: its slot is free again.
        await opened[0].disconnect()
        again = ws_communicator(f"/ws/sessions/{session_id}/", token=alices)
        assert await _outcome(again) is None
        for communicator in [*opened[1:], bobs, again]:
            await communicator.disconnect()

    asyncio.run(scenario())


def test_a_killed_servers_slots_expire_and_refused_handshakes_extend_nothing(
    alice, alice_api, settings
):
    """A process killed with its sockets open gives nothing back: their slots expire four
    re-check intervals after their last refresh."""
    settings.WS_MAX_CONNECTIONS_PER_USER = 2
    settings.WS_AUTH_RECHECK_SECONDS = 0.5  # slots expire after 2 s
    for _ in range(2):
        assert ws_limits.take(alice.pk) is not None  # a dead server's sockets
    alices = api_token(alice)
    session_id = create_session(alice_api)

    async def scenario() -> list[int | None]:
        codes = []
        started = time.monotonic()
        while time.monotonic() - started < 6:
            communicator = ws_communicator(f"/ws/sessions/{session_id}/", token=alices)
            code = await _outcome(communicator)
            codes.append(code)
            await communicator.disconnect()
            if code is None:
                break
            await asyncio.sleep(0.2)
        return codes

    codes = asyncio.run(scenario())
    assert codes[0] == 4429 and codes[-1] is None, codes


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed")
def test_a_full_redis_refuses_a_websocket_with_try_again_later_not_a_500(
    alice, alice_api, settings
):
    from tests.support.private_redis import running_private_redis, this_process_on

    alices = api_token(alice)
    session_id = create_session(alice_api)
    with running_private_redis() as server, this_process_on(settings, server):
        client = redis.Redis.from_url(server.url)
        client.config_set("maxmemory-policy", "noeviction")
        client.set("ballast", b"x" * 2_000_000)
        used = int(client.info("memory")["used_memory"])
        client.config_set("maxmemory", str(used))  # full: every write refused (OOM)
        with pytest.raises(redis.exceptions.ResponseError, match="maxmemory"):
            client.set("one-more", b"x" * 1000)

        async def scenario() -> tuple[int | None, int | None]:
            token = ws_communicator(f"/ws/sessions/{session_id}/", token=alices)
            feed = ws_communicator("/ws/sessions/", token=alices)
            return await _outcome(token), await _outcome(feed)

        assert asyncio.run(scenario()) == (1013, 1013)
        # Room again: sockets open as usual.
        client.config_set("maxmemory", "0")

        async def reopened() -> int | None:
            communicator = ws_communicator(f"/ws/sessions/{session_id}/", token=alices)
            code = await _outcome(communicator)
            await communicator.disconnect()
            return code

        assert asyncio.run(reopened()) is None
        client.close()
