"""An in-memory channel layer that may be written to from any thread.

Channels' InMemoryChannelLayer keeps asyncio queues bound to the event loop of the consumer
that reads them. In the embedded profile the Celery worker is a thread with its own loop, so
a plain `put` from there would not wake the server's loop. This layer hands each send to the
loop that is receiving on the channel.
"""

from __future__ import annotations

import asyncio
from typing import Any

from channels.layers import InMemoryChannelLayer


class ThreadSafeInMemoryChannelLayer(InMemoryChannelLayer):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._receiver_loops: dict[str, asyncio.AbstractEventLoop] = {}

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

    def _remove_from_groups(self, channel: str) -> None:
        self._receiver_loops.pop(channel, None)
        super()._remove_from_groups(channel)
