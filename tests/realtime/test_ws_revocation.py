"""Revoked credentials close their websockets with 4401: a deleted or rotated token, a
deactivated user, a logout. Sockets of other credentials stay open."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from rest_framework.authtoken.models import Token

from tests.support.helpers import api_token, create_session, ws_communicator
from tests.support.websockets import closed_with, login_cookie, open_socket, still_open

pytestmark = pytest.mark.django_db(transaction=True)


def test_it_closes_token_sockets_when_the_token_is_deleted(alice, bob, alice_api):
    session_id = create_session(alice_api)
    alice_key, bob_key = api_token(alice), api_token(bob)

    async def scenario():
        feed = ws_communicator("/ws/sessions/", token=alice_key)
        one = ws_communicator(f"/ws/sessions/{session_id}/", token=alice_key)
        other = ws_communicator("/ws/sessions/", token=bob_key)
        for communicator in (feed, one, other):
            await open_socket(communicator)
        await sync_to_async(Token.objects.filter(key=alice_key).delete)()
        codes = [await closed_with(feed), await closed_with(one)]
        assert await still_open(other)
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
        await open_socket(old)
        new_key = await sync_to_async(rotate)()
        code = await closed_with(old)
        fresh = ws_communicator("/ws/sessions/", token=new_key)
        await open_socket(fresh)
        await fresh.disconnect()
        return code

    assert async_to_sync(scenario)() == 4401


def test_it_closes_every_socket_of_a_deactivated_user(alice, bob, alice_api):
    key = api_token(alice)
    _, cookie = login_cookie("alice")
    _, bob_cookie = login_cookie("bob")

    def deactivate() -> None:
        alice.is_active = False
        alice.save(update_fields=["is_active"])

    async def scenario():
        by_token = ws_communicator("/ws/sessions/", token=key)
        by_cookie = ws_communicator("/ws/sessions/", cookie=cookie)
        other = ws_communicator("/ws/sessions/", cookie=bob_cookie)
        for communicator in (by_token, by_cookie, other):
            await open_socket(communicator)
        await sync_to_async(deactivate)()
        codes = [await closed_with(by_token), await closed_with(by_cookie)]
        assert await still_open(other)
        await other.disconnect()
        return codes

    assert async_to_sync(scenario)() == [4401, 4401]


def test_it_closes_the_sockets_of_a_login_that_logs_out(alice, alice_api):
    browser, cookie = login_cookie("alice")
    _, other_login = login_cookie("alice")
    key = api_token(alice)

    async def scenario():
        logged_out = ws_communicator("/ws/sessions/", cookie=cookie)
        elsewhere = ws_communicator("/ws/sessions/", cookie=other_login)
        agent = ws_communicator("/ws/sessions/", token=key)
        for communicator in (logged_out, elsewhere, agent):
            await open_socket(communicator)
        response = await sync_to_async(browser.post)("/accounts/logout/")
        assert response.status_code in (200, 302)
        code = await closed_with(logged_out)
        assert await still_open(elsewhere) and await still_open(agent)
        await elsewhere.disconnect()
        await agent.disconnect()
        return code

    assert async_to_sync(scenario)() == 4401
