"""Websockets on the production profile, as an agent sees them: a daphne process of its own on
channels_redis and PostgreSQL, and the `websockets` library as the client (it sends no Origin
unless told to).

- An idle socket stays up: connected, quiet for 15 s, it still receives the next broadcast
  (redis-py's default 5 s socket timeout used to cut the layer's 5 s blocking receive: close
  1011 after 5–10 s; 15 s is three such timeouts).
- A token client without Origin is accepted on the API and dashboard sockets; a cookie from a
  foreign Origin is closed with 4403 after the handshake, not refused with HTTP 403.

Needs `DATABASE_URL` (PostgreSQL) and `REDIS_URL`; skipped otherwise.
"""

from __future__ import annotations

import json
import os
import time

import pytest
from django.conf import settings
from django.test import Client
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from compaction_app.realtime import broadcast
from compaction_app.realtime import messages as realtime
from tests.support.daphne import daphne_process, production_env
from tests.support.helpers import api_token, create_session

IDLE_SECONDS = 15

pytestmark = pytest.mark.skipif(
    not (settings.REDIS_URL and os.environ.get("DATABASE_URL")),
    reason="needs the production profile (DATABASE_URL and REDIS_URL)",
)


@pytest.fixture(scope="module")
def daphne_url(django_db_setup, django_db_blocker):
    """A daphne process serving the app on this test run's database, channel prefix and queue."""
    env = production_env()
    with daphne_process(env) as port:
        yield f"ws://127.0.0.1:{port}"


def _is_open(ws) -> bool:
    try:
        ws.recv(timeout=0.5)
    except TimeoutError:
        return True
    except ConnectionClosed:
        return False
    return True


@pytest.mark.django_db(transaction=True)
def test_it_keeps_an_idle_socket_open_and_delivers_after_15_seconds(alice, alice_api, daphne_url):
    session_id = create_session(alice_api)
    token = api_token(alice)
    # No client pings either (ping_interval=None): nothing crosses the sockets while idle.
    with (
        connect(f"{daphne_url}/ws/sessions/{session_id}/?token={token}", ping_interval=None) as api,
        connect(
            f"{daphne_url}/ws/dashboard/sessions/{session_id}/?token={token}", ping_interval=None
        ) as dashboard,
    ):
        time.sleep(IDLE_SECONDS)
        message = realtime.CompactionStart(
            sessionId=session_id,
            compactionId=session_id,
            strategy="summarize",
            trigger="manual",
            message="after idle",
        )
        broadcast.broadcast(session_id=session_id, owner_id=alice.pk, message=message)
        assert json.loads(api.recv(timeout=10)) == message.to_json()
        assert "hx-swap-oob" in dashboard.recv(timeout=10)


@pytest.mark.django_db(transaction=True)
def test_it_accepts_token_clients_that_send_no_origin(alice, alice_api, daphne_url):
    session_id = create_session(alice_api)
    token = api_token(alice)
    with connect(f"{daphne_url}/ws/sessions/{session_id}/?token={token}") as api:
        api.send(json.dumps({"type": "ping"}))
        assert json.loads(api.recv(timeout=10)) == {"type": "pong"}
    with connect(f"{daphne_url}/ws/dashboard/sessions/?token={token}") as dashboard:
        assert _is_open(dashboard)


@pytest.mark.django_db(transaction=True)
def test_it_closes_a_cookie_from_a_foreign_origin_with_4403(alice, alice_api, daphne_url):
    session_id = create_session(alice_api)
    client = Client()
    client.force_login(alice)
    cookie = "; ".join(f"{name}={morsel.value}" for name, morsel in client.cookies.items())
    for path in (f"/ws/sessions/{session_id}/", f"/ws/dashboard/sessions/{session_id}/"):
        with connect(
            f"{daphne_url}{path}",
            origin="https://evil.example",
            additional_headers={"Cookie": cookie},
        ) as ws:
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=10)
            assert closed.value.rcvd.code == 4403
