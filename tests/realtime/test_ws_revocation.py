"""Revoked credentials close their websockets with 4401: a deleted or rotated token, a
deactivated user, a logout. Sockets of other credentials stay open."""

from __future__ import annotations

from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.test import Client
from rest_framework.authtoken.models import Token

from tests.support.helpers import api_token, create_session, ws_communicator

pytestmark = pytest.mark.django_db(transaction=True)


async def _open(communicator: Any) -> None:
    connected, _ = await communicator.connect(timeout=5)
    assert connected
    await communicator.send_json_to({"type": "ping"})
    assert await communicator.receive_json_from(timeout=5) == {"type": "pong"}


async def _closed_with(communicator: Any) -> int | None:
    while True:
        output = await communicator.receive_output(timeout=5)
        if output["type"] == "websocket.close":
            return output.get("code")


async def _still_open(communicator: Any) -> bool:
    await communicator.send_json_to({"type": "ping"})
    return await communicator.receive_json_from(timeout=5) == {"type": "pong"}


def _cookie_for(username: str) -> tuple[Client, str]:
    browser = Client()
    assert browser.login(username=username, password=f"pw-{username}")
    return browser, f"sessionid={browser.cookies['sessionid'].value}"


def test_it_closes_token_sockets_when_the_token_is_deleted(alice, bob, alice_api):
    session_id = create_session(alice_api)
    alice_key, bob_key = api_token(alice), api_token(bob)

    async def scenario():
        feed = ws_communicator("/ws/sessions/", token=alice_key)
        one = ws_communicator(f"/ws/sessions/{session_id}/", token=alice_key)
        other = ws_communicator("/ws/sessions/", token=bob_key)
        for communicator in (feed, one, other):
            await _open(communicator)
        await sync_to_async(Token.objects.filter(key=alice_key).delete)()
        codes = [await _closed_with(feed), await _closed_with(one)]
        assert await _still_open(other)
        await other.disconnect()
        return codes

    assert async_to_sync(scenario)() == [4401, 4401]


def test_it_closes_token_sockets_when_the_token_is_rotated(alice, alice_api):
    old_key = api_token(alice)

    def rotate() -> str:
        Token.objects.filter(user=alice).delete()
        return Token.objects.create(user=alice).key

    async def scenario():
        old = ws_communicator("/ws/sessions/", token=old_key)
        await _open(old)
        new_key = await sync_to_async(rotate)()
        code = await _closed_with(old)
        fresh = ws_communicator("/ws/sessions/", token=new_key)
        await _open(fresh)
        await fresh.disconnect()
        return code

    assert async_to_sync(scenario)() == 4401


def test_it_closes_every_socket_of_a_deactivated_user(alice, bob, alice_api):
    key = api_token(alice)
    _, cookie = _cookie_for("alice")
    _, bob_cookie = _cookie_for("bob")

    def deactivate() -> None:
        alice.is_active = False
        alice.save(update_fields=["is_active"])

    async def scenario():
        by_token = ws_communicator("/ws/sessions/", token=key)
        by_cookie = ws_communicator("/ws/sessions/", cookie=cookie)
        other = ws_communicator("/ws/sessions/", cookie=bob_cookie)
        for communicator in (by_token, by_cookie, other):
            await _open(communicator)
        await sync_to_async(deactivate)()
        codes = [await _closed_with(by_token), await _closed_with(by_cookie)]
        assert await _still_open(other)
        await other.disconnect()
        return codes

    assert async_to_sync(scenario)() == [4401, 4401]


def test_it_closes_the_sockets_of_a_login_that_logs_out(alice, alice_api):
    browser, cookie = _cookie_for("alice")
    _, other_login = _cookie_for("alice")
    key = api_token(alice)

    async def scenario():
        logged_out = ws_communicator("/ws/sessions/", cookie=cookie)
        elsewhere = ws_communicator("/ws/sessions/", cookie=other_login)
        agent = ws_communicator("/ws/sessions/", token=key)
        for communicator in (logged_out, elsewhere, agent):
            await _open(communicator)
        response = await sync_to_async(browser.post)("/accounts/logout/")
        assert response.status_code in (200, 302)
        code = await _closed_with(logged_out)
        assert await _still_open(elsewhere) and await _still_open(agent)
        await elsewhere.disconnect()
        await agent.disconnect()
        return code

    assert async_to_sync(scenario)() == 4401
