"""The gateway's clock: when a call started, which is what a provider's prompt-cache lifetime
is measured against (cache_outcome.py). Wall-clock time, shifted by an offset that tests and
replays move forward (`advance`) instead of waiting out a 5-minute lifetime; the lifetimes
themselves stay the providers' own. Pure: no Django."""

from __future__ import annotations

import datetime
import threading

_lock = threading.Lock()
_offset = 0.0


def now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=_offset)


def timestamp() -> float:
    """`now()` as seconds since the epoch."""
    return now().timestamp()


def advance(seconds: float) -> None:
    """Move the clock forward (a replay's pause between calls, without the wait)."""
    global _offset
    with _lock:
        _offset += seconds


def reset() -> None:
    global _offset
    with _lock:
        _offset = 0.0
