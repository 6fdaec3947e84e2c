"""Django's Redis cache, with a `clear()` that deletes only the cache's own keys.

The production profile keeps the cache, the channel layer (websocket groups and messages)
and the Celery broker (the task queue) in one Redis database. Django's `RedisCache.clear()`
is FLUSHDB: it would also drop every websocket's group membership (pushes silently stop
arriving) and every queued task (a requested compaction never runs). Here `clear()`
deletes the keys under the cache's KEY_PREFIX and nothing else.
"""

from __future__ import annotations

import re
from typing import Any

from django.core.cache.backends.redis import RedisCache

# Keys per SCAN page and per DEL.
_BATCH = 500


def _glob_escape(text: str) -> str:
    """`text` matched literally in a Redis glob pattern."""
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)


class LedgerRedisCache(RedisCache):
    def clear(self) -> None:
        # Django's default key function makes "<prefix>:<version>:<key>" (the prefix may be
        # empty, then keys start with ":").
        pattern = f"{_glob_escape(self.key_prefix)}:*"
        client: Any = self._cache.get_client(None, write=True)  # type: ignore[attr-defined]
        batch: list[bytes] = []
        for key in client.scan_iter(match=pattern, count=_BATCH):
            batch.append(key)
            if len(batch) >= _BATCH:
                client.delete(*batch)
                batch = []
        if batch:
            client.delete(*batch)
