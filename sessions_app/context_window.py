"""Context-window math: pure functions over (type, cost) items, no ORM and no settings."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sessions_app.event_types import EventType

# The context-cost rule (sum of message costs, plus the reply primer when anything is sent) is
# tokens.py's; window math uses it under its own name.
from sessions_app.tokens import REPLY_PRIMER
from sessions_app.tokens import context_tokens as context_cost

ALWAYS_KEPT_TYPES = frozenset({EventType.SYSTEM_PROMPT, EventType.COMPACTION})
USER_TYPES = frozenset({EventType.USER_MESSAGE, EventType.CONTEXT_REFRESH})


@dataclass(frozen=True)
class WindowItem:
    key: str
    type: str
    cost: int
    tool_call_id: str = ""


def effective_limit(*, context_limit: int, max_tokens: int | None, reserve_tokens: int) -> int:
    """The tokens available for the prompt: the smaller of the window and the caller's cap,
    less what the caller reserves for the reply."""
    limit = min(context_limit, max_tokens) if max_tokens else context_limit
    return max(limit - reserve_tokens, 0)


def window_level(
    *, tokens: int, limit: int, compact_threshold: float, hard_threshold: float
) -> str:
    """'ok' below the compact threshold, 'approaching' between the thresholds, 'hard' at or
    above the hard threshold (an empty budget counts as hard)."""
    if limit <= 0:
        return "hard"
    ratio = tokens / limit
    if ratio >= hard_threshold:
        return "hard"
    if ratio >= compact_threshold:
        return "approaching"
    return "ok"


def required_keys(items: Sequence[WindowItem]) -> list[str]:
    """System prompts, the summary and the last user message: never pruned."""
    keys = [item.key for item in items if item.type in ALWAYS_KEPT_TYPES]
    last_user = next((item for item in reversed(items) if item.type in USER_TYPES), None)
    if last_user is not None:
        keys.append(last_user.key)
    return keys


def prune(items: Sequence[WindowItem], *, budget: int) -> list[str] | None:
    """Keep the required items, then fill newest-first within `budget` (context cost, primer
    included). A tool call and its results are kept or dropped together so the result is a
    valid message list. Returns the kept keys in input order, or None when the required items
    alone do not fit."""
    required = set(required_keys(items))
    used = context_cost([item.cost for item in items if item.key in required])
    if used > budget:
        return None
    if not required and items:
        used = REPLY_PRIMER
    # Group tool calls with their results: the unit is dropped or kept whole.
    groups: list[list[WindowItem]] = []
    by_call: dict[str, list[WindowItem]] = {}
    for item in items:
        if item.key in required:
            continue
        if item.tool_call_id and item.type in (EventType.TOOL_CALL, EventType.TOOL_RESULT):
            group = by_call.get(item.tool_call_id)
            if group is None:
                group = by_call[item.tool_call_id] = []
                groups.append(group)
            group.append(item)
        else:
            groups.append([item])
    kept = set(required)
    for group in reversed(groups):
        cost = sum(item.cost for item in group)
        if used + cost > budget:
            # Newest-first fill: stop at the first unit that does not fit, so the kept
            # history is a contiguous recent tail rather than a patchwork.
            break
        used += cost
        kept.update(item.key for item in group)
    return [item.key for item in items if item.key in kept]
