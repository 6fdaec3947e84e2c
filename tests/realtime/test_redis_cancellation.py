"""A cancelled channel-layer call ends: on Python 3.11, `asyncio.wait_for` drops a
cancellation that arrives as the awaited write finishes (fixed in 3.12), and redis-py wraps
every write in it when the connection has a socket timeout. A websocket refused right after
connect then left its receive task blocking on Redis forever, one per refusal, and the test
process could not exit. Needs `REDIS_URL`; skipped otherwise."""

from __future__ import annotations

import asyncio
import threading
import uuid

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.db import connections

from config.asgi import application
from tests.support.helpers import api_token, create_session

pytestmark = pytest.mark.skipif(not settings.REDIS_URL, reason="needs REDIS_URL")


def test_it_ends_a_blocking_read_cancelled_at_any_step():
    layer = get_channel_layer()

    async def scenario() -> list[int]:
        redis = layer.connection(0)
        await redis.ping()
        key = f"{layer.prefix}-cancel-{uuid.uuid4().hex}"
        swallowed = []
        # Cancel after 0, 1, 2, ... loop steps: one of them lands as the write completes.
        for steps in range(40):
            task = asyncio.create_task(redis.bzpopmin(key, timeout=1))
            for _ in range(steps):
                await asyncio.sleep(0)
            task.cancel()
            done, _ = await asyncio.wait({task}, timeout=3)
            if not (done and task.cancelled()):
                swallowed.append(steps)
        return swallowed

    assert async_to_sync(scenario)() == []


def _refused(path: str) -> int:
    async def scenario() -> int:
        communicator = WebsocketCommunicator(application, path)
        connected, _ = await communicator.connect(timeout=5)
        assert connected
        output = await communicator.receive_output(timeout=5)
        return output["code"]

    return async_to_sync(scenario)()


@pytest.mark.django_db(transaction=True)
def test_it_leaves_nothing_running_after_refused_sockets(alice_api, bob):
    # Each refusal runs in its own event loop, torn down as soon as the close arrives: the
    # consumer's receive is cancelled while its fresh Redis connection is being set up.
    session_id = create_session(alice_api)
    token = api_token(bob)
    finished = threading.Event()

    def refuse_many() -> None:
        try:
            for _ in range(60):
                assert _refused(f"/ws/sessions/{session_id}/?token={token}") == 4403
            finished.set()
        finally:
            connections.close_all()  # the thread ends: hand its connection back to the pool

    worker = threading.Thread(target=refuse_many, daemon=True)
    worker.start()
    worker.join(timeout=60)
    assert finished.is_set()
