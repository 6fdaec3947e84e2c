"""How many websockets one user may hold open, across server processes, and the refusals a
handshake can end with (issue 42, row 11: 3,000 sockets on one user's token met no cap, and 437
handshakes were answered 500 when the channel layer's Redis connections ran out; on a full
Redis the handshake was a 500 too).

A user's sockets take slots: WS_MAX_CONNECTIONS_PER_USER cache keys, each taken with an atomic
add (SET NX on Redis, shared by every process; the process's memory on the embedded profile),
given back when the socket closes, and kept alive by the socket's periodic re-check
(revocation.py): a slot expires WS_SLOT_SECONDS after its last refresh, so a killed process
frees its sockets' slots by then. A refused handshake writes nothing. With the cache
unreachable no cap is applied (a warning), as for the rate limit.
"""

from __future__ import annotations

import logging
import random
import uuid
from dataclasses import dataclass

from django.conf import settings
from django.core.cache import cache
from redis.exceptions import RedisError

logger = logging.getLogger("compaction_app.realtime")

# The user holds as many sockets as it may (4429, after HTTP's 429).
CLOSE_TOO_MANY = 4429
# A backing service (Redis full or out of connections) refused the socket's set-up: RFC 6455's
# "Try Again Later".
CLOSE_TRY_AGAIN = 1013


@dataclass(frozen=True)
class Slot:
    key: str
    holder: str


def slot_seconds() -> int:
    """How long a slot outlives its socket's last re-check: four re-checks."""
    return max(int(4 * float(settings.WS_AUTH_RECHECK_SECONDS)), 1)


def _keys(user_id: object, limit: int) -> list[str]:
    return [f"ws-slot:{user_id}:{number}" for number in range(limit)]


def take(user_id: object) -> Slot | None:
    """A slot for one more socket of the user, None when it holds as many as it may. Sync
    (a thread). Raises RedisError/OSError when the cache is unreachable."""
    limit = int(settings.WS_MAX_CONNECTIONS_PER_USER)
    keys = _keys(user_id, limit)
    held = cache.get_many(keys)
    free = [key for key in keys if key not in held]
    # Sockets opened together try different slots first.
    random.shuffle(free)
    holder = uuid.uuid4().hex
    for key in free:
        if cache.add(key, holder, timeout=slot_seconds()):
            return Slot(key, holder)
    return None


def refresh(slot: Slot) -> None:
    """Keep the slot while its socket is open (the socket's periodic re-check)."""
    if cache.get(slot.key) == slot.holder:
        cache.touch(slot.key, timeout=slot_seconds())
    else:
        # Expired meanwhile (a re-check delayed past the expiry): taken again if still free.
        cache.add(slot.key, slot.holder, timeout=slot_seconds())


def give_back(slot: Slot) -> None:
    if cache.get(slot.key) == slot.holder:
        cache.delete(slot.key)


def limited() -> bool:
    return int(settings.WS_MAX_CONNECTIONS_PER_USER) > 0


CACHE_ERRORS = (RedisError, OSError)


def unreachable(exc: BaseException) -> None:
    logger.warning("websocket limit not applied, the cache is unreachable: %s", exc)
