"""Signals through which sessions_app reaches compaction without importing it.

- `events_appended` fires after an append transaction commits, once per request (bulk
  included): kwargs `session_id`, `event_ids`, `event_types` (the distinct types appended) and
  `session` (the row as committed, counters included), so receivers need not query again.
  A caller may collect these instead (`collect_appended`) and send them later, merged into
  one per session (`send_collected`): the gateway does, so that what receivers do (usage
  pushes, auto compaction, search indexing) happens once per provider call and after the
  response, not twice inside it.
- `compaction_command` fires when a client sends a `/compact` user message; a receiver
  returns the serialised compaction it started (the first non-None response is used).
- `session_compaction_requested` is for the Django admin action; kwargs `session_ids`, `user`.
- `token_counts_updated` fires after exact counts (Anthropic's count-tokens API) replaced local
  ones and moved the session's counters; kwargs `session` (as committed).
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.dispatch import Signal

events_appended = Signal()
compaction_command = Signal()
session_compaction_requested = Signal()
token_counts_updated = Signal()


# The list an append adds its events_appended kwargs to instead of sending them (see above).
_collector: contextvars.ContextVar[list[dict[str, Any]] | None] = contextvars.ContextVar(
    "events_appended_collector", default=None
)


def announce_appended(**kwargs: Any) -> None:
    """Send events_appended now, or add it to the collection of the caller's context."""
    collected = _collector.get()
    if collected is None:
        events_appended.send(sender=kwargs.pop("sender"), **kwargs)
    else:
        collected.append(kwargs)


@contextmanager
def collect_appended(collected: list[dict[str, Any]]) -> Iterator[None]:
    """Within the block, appends that commit add their events_appended to `collected`."""
    token = _collector.set(collected)
    try:
        yield
    finally:
        _collector.reset(token)


def send_collected(collected: list[dict[str, Any]]) -> None:
    """Send what was collected: one events_appended per session, its ids in append order, the
    union of the types, and the session row as the last append committed it."""
    merged: dict[Any, dict[str, Any]] = {}
    for kwargs in collected:
        entry = merged.get(kwargs["session_id"])
        if entry is None:
            merged[kwargs["session_id"]] = {**kwargs, "event_ids": list(kwargs["event_ids"])}
            continue
        entry["event_ids"] += kwargs["event_ids"]
        entry["event_types"] = sorted({*entry["event_types"], *kwargs["event_types"]})
        entry["session"] = kwargs["session"]
    collected.clear()
    for kwargs in merged.values():
        events_appended.send(**kwargs)
