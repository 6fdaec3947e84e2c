"""A private redis-server on a spare port, for tests that stop or restart Redis: the shared
Redis other test runs use is never touched."""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis

from tests.support.helpers import closed_port


class PrivateRedis:
    """`start()` (again after `stop()`: the same port, an empty server, as after a restart of
    a Redis without persistence)."""

    def __init__(self) -> None:
        self.port = closed_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                *("redis-server", "--port", str(self.port), "--bind", "127.0.0.1"),
                *("--save", "", "--appendonly", "no"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis.from_url(self.url)
        deadline = time.monotonic() + 10
        while True:
            try:
                if client.ping():
                    return
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
            finally:
                client.close()

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=10)
            self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()


@contextmanager
def running_private_redis() -> Iterator[PrivateRedis]:
    server = PrivateRedis()
    server.start()
    try:
        yield server
    finally:
        server.stop()


@contextmanager
def this_process_on(settings: Any, server: PrivateRedis) -> Iterator[None]:
    """Cache, channel layer and Celery broker of this process pointed at `server`, configured
    exactly as the production profile configures them."""
    from config.celery import app

    timeout = settings.REDIS_CONNECT_TIMEOUT_SECONDS
    original = {"CACHES": settings.CACHES, "CHANNEL_LAYERS": settings.CHANNEL_LAYERS}
    settings.CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": server.url,
            "OPTIONS": {
                "pool_class": "config.redis_pool.SharedBlockingConnectionPool",
                "max_connections": 20,
                "timeout": timeout,
                "socket_connect_timeout": timeout,
                "socket_timeout": timeout,
                "health_check_interval": 30,
            },
        }
    }
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "compaction_app.realtime.layers.LedgerRedisChannelLayer",
            "CONFIG": {
                "hosts": [
                    {
                        "address": server.url,
                        "socket_timeout": 15,
                        "socket_connect_timeout": timeout,
                        "socket_keepalive": True,
                        "health_check_interval": 30,
                    }
                ],
                "prefix": f"private-{uuid.uuid4().hex[:8]}",
            },
        }
    }
    previous = app.conf.broker_url
    app.conf.broker_url = server.url
    _forget_broker_connections(app)
    try:
        yield
    finally:
        # Back to the usual cache now: the autouse fixture clears the cache after the test.
        for name, value in original.items():
            setattr(settings, name, value)
        app.conf.broker_url = previous
        _forget_broker_connections(app)


def _forget_broker_connections(app: Any) -> None:
    # Celery caches its connection and producer pools on first use; drop them so the next
    # publish connects to the broker URL now configured.
    app._pool = None
    app.amqp._producer_pool = None
