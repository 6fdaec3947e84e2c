"""One Redis connection pool per process for Django's cache.

Django's cache handler keeps one cache object per request context under ASGI, and each
`RedisCache` object builds its own connection pool, which nothing ever closes: an ASGI server
accumulates a pool (and an open socket) per request until garbage collection finds them. This
pool class hands every cache object the same process-wide pool for the same URL and options,
and blocks (up to its `timeout`) instead of opening more than `max_connections`.
"""

from __future__ import annotations

import threading
from typing import Any

import redis


class SharedBlockingConnectionPool(redis.BlockingConnectionPool):
    _shared: dict[str, SharedBlockingConnectionPool] = {}
    _shared_lock = threading.Lock()

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> SharedBlockingConnectionPool:  # type: ignore[override]
        key = repr((url, sorted(kwargs.items())))
        with cls._shared_lock:
            pool = cls._shared.get(key)
            if pool is None:
                pool = super().from_url(url, **kwargs)
                cls._shared[key] = pool
            return pool
