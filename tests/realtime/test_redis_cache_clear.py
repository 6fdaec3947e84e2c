"""The cache shares one Redis database with the channel layer and the Celery broker (production
profile): clearing the cache deletes the cache's own keys and nothing of theirs.

Django's RedisCache.clear() is FLUSHDB. Every test clears the cache, so with it one test run
wiped the websocket groups and queued tasks of every other run on the same Redis (pushes that
never arrived, compactions that never ran), and a deployment's cache clear would do the same.
"""

from __future__ import annotations

import uuid

import pytest
import redis
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.core.cache import cache

pytestmark = pytest.mark.skipif(not settings.REDIS_URL, reason="needs Redis")


def test_it_clears_the_cache_but_keeps_websocket_groups_queued_tasks_and_other_prefixes():
    client = redis.Redis.from_url(settings.REDIS_URL)
    marker = uuid.uuid4().hex
    layer = get_channel_layer()
    group = f"ledger.session.{marker}"
    queued = f"{settings.CELERY_TASK_DEFAULT_QUEUE}-{marker}"
    other_cache = f"ledger-cache-other-{marker}:1:throttle_user_1"

    async def join() -> str:
        channel = await layer.new_channel()
        await layer.group_add(group, channel)
        return channel

    channel = async_to_sync(join)()
    client.lpush(queued, "a task")
    client.set(other_cache, "another process's cache entry")
    cache.set(f"mine-{marker}", 1)
    try:
        cache.clear()

        assert cache.get(f"mine-{marker}") is None
        assert client.zscore(layer._group_key(group), channel) is not None
        assert client.lrange(queued, 0, -1) == [b"a task"]
        assert client.get(other_cache) == b"another process's cache entry"
    finally:
        client.delete(layer._group_key(group), queued, other_cache)
        client.close()


def test_it_clears_every_key_of_its_own_prefix_in_batches():
    for i in range(1200):
        cache.set(f"bulk-{i}", i)
    cache.set("with[glob]*chars?", 1)

    cache.clear()

    assert cache.get_many([f"bulk-{i}" for i in range(1200)]) == {}
    assert cache.get("with[glob]*chars?") is None
