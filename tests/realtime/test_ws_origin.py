"""The websocket Origin rule: a token connection is accepted with any Origin or none; a
cookie-authenticated one needs a same-site Origin; refusals accept, then close with 4401/4403
(never a bare HTTP 403). API and dashboard sockets alike, on both profiles.

The live-client variant (the `websockets` library against daphne, sending no Origin) is in
tests/realtime/test_ws_production.py, which needs PostgreSQL and Redis.
"""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator
from django.test import Client

from config.asgi import application
from tests.support.helpers import api_token, create_session

FOREIGN = (b"origin", b"https://evil.example")
SAME_SITE = (b"origin", b"http://testserver")


def _paths(session_id: str) -> list[str]:
    return [
        "/ws/sessions/",
        f"/ws/sessions/{session_id}/",
        "/ws/dashboard/sessions/",
        f"/ws/dashboard/sessions/{session_id}/",
    ]


def _session_cookie(user) -> tuple[bytes, bytes]:
    client = Client()
    client.force_login(user)
    cookies = "; ".join(f"{name}={morsel.value}" for name, morsel in client.cookies.items())
    return (b"cookie", cookies.encode())


def _outcome(path: str, headers: list[tuple[bytes, bytes]]) -> str | int:
    """ "open" if the connection is accepted and stays open, else the close code (or "http"
    for a handshake refused before accept, which a client sees as a bare HTTP 403)."""

    async def scenario():
        communicator = WebsocketCommunicator(application, path, headers=headers)
        connected, code = await communicator.connect(timeout=5)
        if not connected:
            return "http"
        if await communicator.receive_nothing(timeout=0.3):
            await communicator.disconnect()
            return "open"
        output = await communicator.receive_output(timeout=5)
        assert output["type"] == "websocket.close", output
        return output.get("code")

    return async_to_sync(scenario)()


@pytest.mark.django_db(transaction=True)
def test_it_accepts_a_token_connection_that_sends_no_origin(alice, alice_api):
    session_id = create_session(alice_api)
    token = api_token(alice)
    outcomes = [_outcome(f"{path}?token={token}", []) for path in _paths(session_id)]
    assert outcomes == ["open"] * 4


@pytest.mark.django_db(transaction=True)
def test_it_accepts_a_token_connection_from_a_foreign_origin(alice, alice_api):
    session_id = create_session(alice_api)
    token = api_token(alice)
    outcomes = [_outcome(f"{path}?token={token}", [FOREIGN]) for path in _paths(session_id)]
    assert outcomes == ["open"] * 4


@pytest.mark.django_db(transaction=True)
def test_it_accepts_a_cookie_connection_from_the_same_site(alice, alice_api):
    session_id = create_session(alice_api)
    cookie = _session_cookie(alice)
    outcomes = [_outcome(path, [SAME_SITE, cookie]) for path in _paths(session_id)]
    assert outcomes == ["open"] * 4


@pytest.mark.django_db(transaction=True)
def test_it_closes_a_cookie_connection_from_a_foreign_origin_with_4403(alice, alice_api):
    session_id = create_session(alice_api)
    cookie = _session_cookie(alice)
    outcomes = [_outcome(path, [FOREIGN, cookie]) for path in _paths(session_id)]
    assert outcomes == [4403] * 4


@pytest.mark.django_db(transaction=True)
def test_it_closes_a_cookie_connection_without_origin_with_4403(alice, alice_api):
    # Browsers always send Origin; a cookie without one is not a page of this site.
    session_id = create_session(alice_api)
    cookie = _session_cookie(alice)
    assert [_outcome(path, [cookie]) for path in _paths(session_id)] == [4403] * 4


@pytest.mark.django_db(transaction=True)
def test_it_closes_an_anonymous_or_bad_token_connection_without_origin_with_4401(alice, alice_api):
    session_id = create_session(alice_api)
    paths = _paths(session_id)
    assert [_outcome(path, []) for path in paths] == [4401] * 4
    assert [_outcome(f"{path}?token=nope", []) for path in paths] == [4401] * 4


@pytest.mark.django_db(transaction=True)
def test_it_closes_a_token_connection_to_another_users_session_with_4403(alice, bob, alice_api):
    session_id = create_session(alice_api)
    token = api_token(bob)
    outcomes = [
        _outcome(f"/ws/sessions/{session_id}/?token={token}", []),
        _outcome(f"/ws/dashboard/sessions/{session_id}/?token={token}", []),
    ]
    assert outcomes == [4403, 4403]
