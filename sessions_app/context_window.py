"""Context-window math: pure functions over (type, cost) items, no ORM and no settings.

The window decision and the prune that use it are the fitting core's
(compaction_app/fitting.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sessions_app.event_types import EventType

# The context-cost rule (sum of message costs, plus the reply primer when anything is sent) is
# tokens.py's; window math uses it under its own name.
from sessions_app.tokens import REPLY_PRIMER
from sessions_app.tokens import context_tokens as context_cost

__all__ = [
    "ALWAYS_KEPT_TYPES",
    "REPLY_PRIMER",
    "USER_TYPES",
    "WindowItem",
    "context_cost",
    "effective_limit",
    "required_keys",
]

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


def required_keys(items: Sequence[WindowItem]) -> list[str]:
    """System prompts, the summary and the last user message: never pruned."""
    keys = [item.key for item in items if item.type in ALWAYS_KEPT_TYPES]
    last_user = next((item for item in reversed(items) if item.type in USER_TYPES), None)
    if last_user is not None:
        keys.append(last_user.key)
    return keys
