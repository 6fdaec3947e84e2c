"""Where the gateway's sync work (the ORM) runs: a few long-lived worker threads per process
(OS threads; named so as not to be mistaken for a session's conversation threads).

Django runs an async view's `sync_to_async` calls on a thread of the request's own (a new
executor per request, torn down when the response is done). On the gateway's hot path that
cost more than the work itself: starting and joining a thread per provider call, and two
more hops for the request_started/request_finished signals. The gateway's hops run here
instead, and each hands its database connection back to the pool (PostgreSQL) when it ends,
as Django does at the end of a request: nothing stays checked out while the upstream
answers, and a connection broken meanwhile is never reused by the next hop's thread.
SQLite's connection stays open with its thread.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connections

T = TypeVar("T")

# A few threads, and never more than the process's database pool holds connections (each
# hop uses one): the hops are short, and a queue here is cheaper than threads that wait for
# the pool.
MAX_THREADS = 8

# Long work (a synchronous compaction that may wait for a remote summarizer) runs on threads
# of its own, so it never holds one of the short hops' few threads for minutes.
MAX_LONG_THREADS = 4

_executor: ThreadPoolExecutor | None = None
_long_executor: ThreadPoolExecutor | None = None


def executor() -> ThreadPoolExecutor:
    global _executor
    if _executor is None:
        size = max(1, min(MAX_THREADS, int(settings.DB_POOL_MAX_SIZE)))
        _executor = ThreadPoolExecutor(max_workers=size, thread_name_prefix="gateway-db")
    return _executor


def long_executor() -> ThreadPoolExecutor:
    global _long_executor
    if _long_executor is None:
        _long_executor = ThreadPoolExecutor(
            max_workers=MAX_LONG_THREADS, thread_name_prefix="gateway-long"
        )
    return _long_executor


def restart() -> None:
    """Replace the threads, once the current ones finish their work (tests: the next hops open
    new connections, so a hook on connection_created sees their statements)."""
    global _executor, _long_executor
    for old in (_executor, _long_executor):
        if old is not None:
            old.shutdown(wait=True)
    _executor = _long_executor = None


def _call(fn: Callable[..., T], args: tuple[Any, ...], kwargs: dict[str, Any]) -> T:
    try:
        return fn(*args, **kwargs)
    finally:
        for connection in connections.all(initialized_only=True):
            # SQLite's connection is a file handle: nothing to hand back and nothing that goes
            # stale, and opening one costs more than a hop (PRAGMAs, Django's SQL functions).
            if connection.vendor != "sqlite" or connection.errors_occurred:
                connection.close()


async def run(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """Call the sync `fn(*args, **kwargs)` on a gateway thread (with the caller's context
    variables) and return its result."""
    call = sync_to_async(_call, thread_sensitive=False, executor=executor())
    return await call(fn, args, kwargs)


async def run_long(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """`run`, on the long-work threads (a hop that may wait minutes)."""
    call = sync_to_async(_call, thread_sensitive=False, executor=long_executor())
    return await call(fn, args, kwargs)
