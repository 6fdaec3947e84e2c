"""Per-user concurrency for heavy requests: the fitted `/context` of a big session, a
compaction dry run, recall. Each reads and renders the whole session, so one user running
many at once took the machine's CPU from everyone else's light reads; a user gets a few
slots, and a request past them is answered 429 at once rather than queued.

The count is a cache counter per user (Redis on the production profile, so every process
sees it; the process's own memory on the embedded one, which runs one process). A slot is
given back in `finally`; the counter expires HEAVY_REQUEST_EXPIRY_SECONDS after the last
request took one, so a process killed mid-request cannot lock its user out for good. When
the cache is unreachable the limit is not applied (with a warning), as the rate limit does.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from django.conf import settings
from django.core.cache import cache
from redis.exceptions import RedisError

from sessions_app.errors import TooManyRequests

logger = logging.getLogger("sessions_app.heavy")

# A heavy request takes a second or a few; trying again after one is about right.
RETRY_AFTER_SECONDS = 1


def _key(user_id: object) -> str:
    return f"heavy-requests:{user_id}"


def _take(key: str) -> int:
    expiry = settings.HEAVY_REQUEST_EXPIRY_SECONDS
    cache.add(key, 0, timeout=expiry)
    try:
        taken = cache.incr(key)
    except ValueError:  # expired between add and incr
        cache.add(key, 1, timeout=expiry)
        taken = 1
    cache.touch(key, timeout=expiry)
    return int(taken)


def _give_back(key: str) -> None:
    try:
        if cache.decr(key) < 0:  # the counter expired and was started again meanwhile
            cache.delete(key)
    except ValueError:  # expired: nothing to give back
        pass


@contextmanager
def heavy_slot(*, user_id: object) -> Iterator[None]:
    """Hold one of the user's heavy-request slots for the block, or raise TooManyRequests."""
    limit = settings.HEAVY_REQUESTS_PER_USER
    if limit <= 0:
        yield
        return
    key = _key(user_id)
    try:
        taken = _take(key)
    except (RedisError, OSError) as exc:
        logger.warning("heavy-request limit not applied, the cache is unreachable: %s", exc)
        yield
        return
    if taken > limit:
        try:
            _give_back(key)
        except (RedisError, OSError) as exc:
            logger.warning("heavy-request slot not given back: %s", exc)
        raise TooManyRequests(
            f"at most {limit} heavy requests (context, compaction dry runs, recall) may run "
            "at once per user; retry when one has finished",
            retryAfter=RETRY_AFTER_SECONDS,
            limit=limit,
        )
    try:
        yield
    finally:
        try:
            _give_back(key)
        except (RedisError, OSError) as exc:
            # The counter's expiry gives the slot back.
            logger.warning("heavy-request slot not given back: %s", exc)
