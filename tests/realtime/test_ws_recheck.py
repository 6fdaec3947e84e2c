"""Open websockets re-check their credential and permissions: a staff user demoted, a password
changed, a token deleted or a login ended by another process (here: SQL, which no signal of this
process reports) closes the sockets that depended on it. A change made through this process
closes them at once (its signals); another process's within `WS_AUTH_RECHECK_SECONDS`, which
these tests shorten. Sockets whose credential and permissions hold stay open."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.contrib.auth.hashers import make_password
from django.db import connection

from tests.support.helpers import api_token, create_session, ws_communicator
from tests.support.websockets import closed_with, login_cookie, open_socket, still_open

pytestmark = pytest.mark.django_db(transaction=True)

RECHECK_SECONDS = 0.5


@pytest.fixture
def quick_rechecks(settings) -> None:
    settings.WS_AUTH_RECHECK_SECONDS = RECHECK_SECONDS


def _sql(statement: str, params: list[Any]) -> None:
    """A change as another process makes it: straight to the database, no model, no signal."""
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        assert cursor.rowcount == 1


def _table(model: Any) -> str:
    return connection.ops.quote_name(model._meta.db_table)


async def _open_dashboard(communicator: Any) -> None:
    # The dashboard's sockets answer no ping: connected is all there is to see.
    connected, _ = await communicator.connect(timeout=5)
    assert connected


# --- demotion --------------------------------------------------------------------------------


def test_it_closes_the_staff_feeds_of_a_user_demoted_here_at_once(
    alice, staff, alice_api, staff_api
):
    alice_session = create_session(alice_api)
    own_session = create_session(staff_api)
    key, alice_key = api_token(staff), api_token(alice)
    _, cookie = login_cookie("staff")

    def demote() -> None:
        staff.is_staff = False
        staff.save(update_fields=["is_staff"])

    async def scenario():
        every_session = ws_communicator("/ws/sessions/", token=key)
        dashboard = ws_communicator("/ws/dashboard/sessions/", cookie=cookie)
        alices = ws_communicator(f"/ws/sessions/{alice_session}/", token=key)
        own = ws_communicator(f"/ws/sessions/{own_session}/", token=key)
        owner = ws_communicator(f"/ws/sessions/{alice_session}/", token=alice_key)
        for communicator in (every_session, alices, own, owner):
            await open_socket(communicator)
        await _open_dashboard(dashboard)
        await sync_to_async(demote)()
        # The default re-check interval (15 s) is longer than these waits: the signal did it.
        codes = [await closed_with(c) for c in (every_session, dashboard, alices)]
        assert await still_open(own) and await still_open(owner)
        await own.disconnect()
        await owner.disconnect()
        return codes

    assert async_to_sync(scenario)() == [4403, 4403, 4403]


def test_it_closes_the_staff_feed_of_a_user_another_process_demoted(
    staff, staff_api, quick_rechecks
):
    key = api_token(staff)
    user_table = _table(type(staff))

    async def scenario():
        every_session = ws_communicator("/ws/sessions/", token=key)
        await open_socket(every_session)
        await sync_to_async(_sql)(
            f"UPDATE {user_table} SET is_staff = %s WHERE id = %s", [False, staff.pk]
        )
        code = await closed_with(every_session)
        # Reconnecting gives the user its own sessions' feed.
        again = ws_communicator("/ws/sessions/", token=key)
        await open_socket(again)
        await again.disconnect()
        return code

    assert async_to_sync(scenario)() == 4403


# --- a new password --------------------------------------------------------------------------


def test_it_closes_cookie_sockets_when_the_password_changes_here_at_once(alice, bob, alice_api):
    session_id = create_session(alice_api)
    _, cookie = login_cookie("alice")
    _, bob_cookie = login_cookie("bob")
    key = api_token(alice)

    def change_password() -> None:
        alice.set_password("a new password")
        alice.save()

    async def scenario():
        feed = ws_communicator("/ws/sessions/", cookie=cookie)
        one = ws_communicator(f"/ws/sessions/{session_id}/", cookie=cookie)
        dashboard = ws_communicator(f"/ws/dashboard/sessions/{session_id}/", cookie=cookie)
        agent = ws_communicator("/ws/sessions/", token=key)
        other = ws_communicator("/ws/sessions/", cookie=bob_cookie)
        for communicator in (feed, one, agent, other):
            await open_socket(communicator)
        await _open_dashboard(dashboard)
        await sync_to_async(change_password)()
        codes = [await closed_with(c) for c in (feed, one, dashboard)]
        # The token is a credential of its own, which a new password does not revoke.
        assert await still_open(agent) and await still_open(other)
        await agent.disconnect()
        await other.disconnect()
        return codes

    assert async_to_sync(scenario)() == [4401, 4401, 4401]


def test_it_closes_cookie_sockets_when_another_process_changes_the_password(alice, quick_rechecks):
    _, cookie = login_cookie("alice")
    user_table = _table(type(alice))

    async def scenario():
        feed = ws_communicator("/ws/sessions/", cookie=cookie)
        await open_socket(feed)
        await sync_to_async(_sql)(
            f"UPDATE {user_table} SET password = %s WHERE id = %s",
            [make_password("changed elsewhere"), alice.pk],
        )
        return await closed_with(feed)

    assert async_to_sync(scenario)() == 4401


# --- a credential ended by another process ---------------------------------------------------


def test_it_closes_a_token_socket_within_the_interval_when_another_process_deletes_the_token(
    alice, bob, quick_rechecks
):
    from rest_framework.authtoken.models import Token

    key, bob_key = api_token(alice), api_token(bob)

    async def scenario():
        feed = ws_communicator("/ws/sessions/", token=key)
        other = ws_communicator("/ws/sessions/", token=bob_key)
        await open_socket(feed)
        await open_socket(other)
        await sync_to_async(_sql)(f"DELETE FROM {_table(Token)} WHERE key = %s", [key])
        started = time.monotonic()
        code = await closed_with(feed)
        waited = time.monotonic() - started
        assert await still_open(other)
        await other.disconnect()
        return code, waited

    code, waited = async_to_sync(scenario)()
    assert code == 4401
    assert waited < RECHECK_SECONDS + 2


def test_it_closes_a_cookie_socket_when_another_process_ends_its_login(alice, quick_rechecks):
    from django.contrib.sessions.models import Session

    browser, cookie = login_cookie("alice")
    _, other_login = login_cookie("alice")

    async def scenario():
        ended = ws_communicator("/ws/sessions/", cookie=cookie)
        elsewhere = ws_communicator("/ws/sessions/", cookie=other_login)
        await open_socket(ended)
        await open_socket(elsewhere)
        await sync_to_async(_sql)(
            f"DELETE FROM {_table(Session)} WHERE session_key = %s",
            [browser.cookies["sessionid"].value],
        )
        code = await closed_with(ended)
        assert await still_open(elsewhere)
        await elsewhere.disconnect()
        return code

    assert async_to_sync(scenario)() == 4401


def test_it_keeps_sockets_open_across_rechecks_while_their_credentials_hold(
    alice, staff, alice_api, quick_rechecks
):
    session_id = create_session(alice_api)
    _, cookie = login_cookie("alice")
    _, staff_cookie = login_cookie("staff")
    alice_key, staff_key = api_token(alice), api_token(staff)

    async def scenario():
        sockets = [
            ws_communicator("/ws/sessions/", token=alice_key),
            ws_communicator("/ws/sessions/", cookie=cookie),
            ws_communicator("/ws/sessions/", token=staff_key),
            ws_communicator(f"/ws/sessions/{session_id}/", cookie=staff_cookie),
        ]
        for communicator in sockets:
            await open_socket(communicator)
        await asyncio.sleep(4 * RECHECK_SECONDS)  # a few re-checks each
        still = [await still_open(communicator) for communicator in sockets]
        for communicator in sockets:
            await communicator.disconnect()
        return still

    assert async_to_sync(scenario)() == [True, True, True, True]


def test_it_closes_the_sockets_on_a_deleted_session_at_their_next_recheck(
    alice, alice_api, quick_rechecks
):
    session_id = create_session(alice_api)
    key = api_token(alice)

    async def scenario():
        one = ws_communicator(f"/ws/sessions/{session_id}/", token=key)
        feed = ws_communicator("/ws/sessions/", token=key)
        await open_socket(one)
        await open_socket(feed)
        deleted = await sync_to_async(alice_api.delete)(f"/api/v1/sessions/{session_id}")
        assert deleted.status_code == 204
        code = await closed_with(one)
        assert await still_open(feed)
        await feed.disconnect()
        return code

    assert async_to_sync(scenario)() == 4403
