"""Per-user concurrency for heavy requests: the one limit on every path into work that reads a
whole session or a whole large body. Each such request reads and renders a whole session (or
counts a whole body), so one user running many at once took the machine's CPU, and the
database pool, from everyone else's light reads; a user gets a few slots, and a request past
them is answered 429 at once rather than queued.

The paths (issue 42, rows 2 and 3: the limit held on REST only): REST `/context` (GET and POST),
compaction dry runs and recall; MCP `ledger_recall` and `ledger_compact` with `dryRun`; the
gateway's token counting (Anthropic `count_tokens`, Gemini `countTokens`), which needs no
provider key and reads a body of up to 32 MiB.

A user's slots are HEAVY_REQUESTS_PER_USER cache keys, each taken with an atomic add (SET NX
on Redis, so every process of the production profile sees them; the process's own memory on
the embedded one, which runs one process) and given back with a delete in `finally`. Each slot
expires HEAVY_REQUEST_EXPIRY_SECONDS after it was taken, so a process killed mid-request frees
its slots by then; a refused try writes nothing, so it extends nothing. (The limit used to be one
counter whose expiry every try refreshed, refused ones included: a client retrying every second
after its server was killed stayed locked out for good; issue 42, row 5.) When the cache is
unreachable the limit is not applied (with a warning), as the rate limit does.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from django.conf import settings
from django.core.cache import cache
from redis.exceptions import RedisError

from sessions_app.errors import TooManyRequests

logger = logging.getLogger("sessions_app.heavy")

# A heavy request takes a second or a few; trying again after one is about right.
RETRY_AFTER_SECONDS = 1


def _slot_keys(user_id: object, limit: int) -> list[str]:
    return [f"heavy-slot:{user_id}:{number}" for number in range(limit)]


def _take(user_id: object, limit: int, holder: str) -> str | None:
    """The key of a free slot, now held by `holder` until it is given back or expires; None
    when every slot is held (nothing written)."""
    expiry = settings.HEAVY_REQUEST_EXPIRY_SECONDS
    for key in _slot_keys(user_id, limit):
        if cache.add(key, holder, timeout=expiry):
            return key
    return None


def _give_back(key: str, holder: str) -> None:
    # Only the holder's own slot: one that expired (a request longer than the expiry) may
    # have been taken by another request meanwhile.
    if cache.get(key) == holder:
        cache.delete(key)


def held_slots(*, user_id: object) -> int:
    """How many of the user's slots are held now (tests, diagnostics)."""
    keys = _slot_keys(user_id, max(settings.HEAVY_REQUESTS_PER_USER, 0))
    return len(cache.get_many(keys)) if keys else 0


@contextmanager
def heavy_slot(*, user_id: object) -> Iterator[None]:
    """Hold one of the user's heavy-request slots for the block, or raise TooManyRequests."""
    limit = settings.HEAVY_REQUESTS_PER_USER
    if limit <= 0:
        yield
        return
    holder = uuid.uuid4().hex
    try:
        key = _take(user_id, limit, holder)
    except (RedisError, OSError) as exc:
        logger.warning("heavy-request limit not applied, the cache is unreachable: %s", exc)
        yield
        return
    if key is None:
        raise TooManyRequests(
            f"at most {limit} heavy requests (context, compaction dry runs, recall, token "
            "counting) may run at once per user; retry when one has finished",
            retryAfter=RETRY_AFTER_SECONDS,
            limit=limit,
        )
    try:
        yield
    finally:
        try:
            _give_back(key, holder)
        except (RedisError, OSError) as exc:
            # The slot's expiry gives it back.
            logger.warning("heavy-request slot not given back: %s", exc)
