"""The channel layers: an in-memory one that may be written to from any thread, and the Redis
one with a send to several groups in one round trip.

Channels' InMemoryChannelLayer keeps asyncio queues bound to the event loop of the consumer
that reads them. In the embedded profile the Celery worker is a thread with its own loop, so
a plain `put` from there would not wake the server's loop (the message would sit until the
loop woke for some other reason). This layer hands each send to the loop that is receiving on
the channel, and guards the group bookkeeping with a lock because two threads now touch it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Sequence
from typing import Any

from channels.exceptions import ChannelFull
from channels.layers import InMemoryChannelLayer
from channels_redis.core import RedisChannelLayer


class ThreadSafeInMemoryChannelLayer(InMemoryChannelLayer):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._receiver_loops: dict[str, asyncio.AbstractEventLoop] = {}
        # Re-entrant: _clean_expired calls _remove_from_groups.
        self._lock = threading.RLock()

    async def receive(self, channel: str) -> Any:
        self._receiver_loops[channel] = asyncio.get_running_loop()
        return await super().receive(channel)

    async def send(self, channel: str, message: dict[str, Any]) -> None:
        loop = self._receiver_loops.get(channel)
        current = asyncio.get_running_loop()
        if loop is None or loop is current or loop.is_closed() or not loop.is_running():
            await super().send(channel, message)
            return
        future = asyncio.run_coroutine_threadsafe(super().send(channel, message), loop)
        await asyncio.wrap_future(future)

    # Group bookkeeping is iterated by one thread while another may add to it ("dictionary
    # changed size during iteration"), so every read-modify of `groups` holds the lock. None
    # of these await while holding it.

    def _clean_expired(self) -> None:
        with self._lock:
            super()._clean_expired()

    def _remove_from_groups(self, channel: str) -> None:
        with self._lock:
            self._receiver_loops.pop(channel, None)
            super()._remove_from_groups(channel)

    async def group_add(self, group: str, channel: str) -> None:
        self.require_valid_group_name(group)
        self.require_valid_channel_name(channel)
        with self._lock:
            self.groups.setdefault(group, {})[channel] = time.time()

    async def group_discard(self, group: str, channel: str) -> None:
        self.require_valid_channel_name(channel)
        self.require_valid_group_name(group)
        with self._lock:
            members = self.groups.get(group)
            if members:
                members.pop(channel, None)
                if not members:
                    self.groups.pop(group, None)
            # A consumer leaves its groups when it disconnects; forget its loop then, or the
            # map grows by one entry per connection for the life of the server.
            if not any(channel in m for m in self.groups.values()):
                self._receiver_loops.pop(channel, None)

    async def group_send(self, group: str, message: dict[str, Any]) -> None:
        assert isinstance(message, dict), "Message is not a dict"
        self.require_valid_group_name(group)
        self._clean_expired()
        with self._lock:
            channels = list(self.groups.get(group, {}))
        for channel in channels:
            with contextlib.suppress(ChannelFull):
                await self.send(channel, message)

    async def flush(self) -> None:
        with self._lock:
            self._receiver_loops.clear()
            self.channels.clear()
            self.groups.clear()


class LedgerRedisChannelLayer(RedisChannelLayer):
    """channels_redis's layer, plus `group_send_many`.

    Every append pushes the session's usage to three groups (the session, its owner, staff).
    channels_redis's group_send costs two round trips per group before it knows whether the
    group has members, six per push: on the gateway's path that was the largest Redis cost
    and it ran on the event loop that serves the next call. Most groups are empty (nobody
    watches), so the membership of all of them is read in one pipeline, and only groups
    with members go on to channels_redis's own group_send.
    """

    async def group_send_many(self, groups: Sequence[str], message: dict[str, Any]) -> None:
        for group in groups:
            assert self.require_valid_group_name(group), "Group name not valid"
        by_connection: dict[int, list[str]] = {}
        for group in groups:
            by_connection.setdefault(self.consistent_hash(group), []).append(group)
        expired = int(time.time()) - self.group_expiry
        watched: list[str] = []
        for index, members in by_connection.items():
            pipe = self.connection(index).pipeline(transaction=False)
            for group in members:
                key = self._group_key(group)
                pipe.zremrangebyscore(key, min=0, max=expired)
                pipe.zcard(key)
            results = await pipe.execute()
            watched += [group for group, size in zip(members, results[1::2], strict=True) if size]
        for group in watched:
            await self.group_send(group, message)
