"""Bounded connections on the production profile: requests served on many threads (as ASGI
does) share one PostgreSQL pool per process instead of keeping a connection per thread, and
the Redis cache shares one pool instead of one per request context."""

from __future__ import annotations

import os
import threading

import pytest
from django.conf import settings
from django.db import connection

from tests.support.helpers import api_token, create_session

THREADS = 16


@pytest.mark.skipif(not os.environ.get("DATABASE_URL"), reason="needs PostgreSQL")
@pytest.mark.django_db(transaction=True)
def test_it_keeps_postgresql_connections_within_the_pool_for_many_request_threads(alice, alice_api):
    from asgiref.sync import async_to_sync
    from channels.testing import HttpCommunicator

    from config.asgi import application

    session_id = create_session(alice_api)
    headers = [(b"authorization", f"Token {api_token(alice)}".encode()), (b"host", b"testserver")]
    pool_size = settings.DATABASES["default"]["OPTIONS"]["pool"]["max_size"]
    assert pool_size < THREADS
    served = threading.Barrier(THREADS + 1)
    release = threading.Event()
    statuses: list[int] = []

    def request_thread() -> None:
        # Through the ASGI handler (the test client skips its end-of-request clean-up), on a
        # thread that stays alive afterwards as ASGI executor threads do: with a persistent
        # connection per thread, each would keep one open.
        communicator = HttpCommunicator(
            application, "GET", f"/api/v1/sessions/{session_id}/usage", headers=headers
        )
        statuses.append(async_to_sync(communicator.get_response)(timeout=30)["status"])
        served.wait(timeout=60)
        release.wait(timeout=60)

    threads = [threading.Thread(target=request_thread) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    served.wait(timeout=60)
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()")
        (open_connections,) = cursor.fetchone()
    release.set()
    for thread in threads:
        thread.join()

    assert statuses == [200] * THREADS
    # The pool's connections (this thread's included) and nothing per thread.
    assert open_connections <= pool_size + 1, open_connections


@pytest.mark.skipif(not settings.REDIS_URL, reason="needs Redis")
def test_it_shares_one_redis_cache_pool_across_request_contexts():
    from django.core.cache import caches

    pools = []

    def request_context() -> None:
        cache = caches["default"]
        cache.get("pool-probe")
        pools.append(cache._cache._get_connection_pool(write=False))

    threads = [threading.Thread(target=request_context) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len({id(pool) for pool in pools}) == 1
