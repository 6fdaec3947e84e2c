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
    "Key",
    "ALWAYS_KEPT_TYPES",
    "APPROACHING",
    "HARD",
    "OK",
    "REPLY_PRIMER",
    "USER_TYPES",
    "WindowItem",
    "WindowLevel",
    "context_cost",
    "effective_limit",
    "required_keys",
    "window_level",
]

OK = "ok"
APPROACHING = "approaching"
HARD = "hard"


@dataclass(frozen=True)
class WindowLevel:
    """How full a window is: every figure a surface shows about it (percentUsed, nearLimit,
    atLimit, the tokens left before the next compaction) and the decision fitting and the auto
    trigger take on it (`level`). Built only by `window_level`, so the REST usage document, a
    thread's usage, the dashboard's gauge and schedule, the MCP tools, the gateway's headers,
    the auto trigger and the fitting core cannot disagree on a boundary."""

    tokens: int
    window: int
    ratio: float
    # 100 × tokens / window, one decimal (the API's percentUsed).
    percent_used: float
    # At or past the compact threshold.
    near_limit: bool
    # At or past the hard-limit threshold.
    at_limit: bool
    # OK below the compact threshold, APPROACHING between the thresholds, HARD at or past the
    # hard threshold (an empty window is HARD).
    level: str
    # The token counts the thresholds fall at in this window, and what is left before each.
    compact_at: int
    hard_at: int
    # The thresholds themselves, as whole percentages of the window (for labels).
    compact_percent: int = 0
    hard_percent: int = 0

    @property
    def tokens_to_compact(self) -> int:
        return max(self.compact_at - self.tokens, 0)

    @property
    def tokens_to_hard(self) -> int:
        return max(self.hard_at - self.tokens, 0)


def window_level(
    *, tokens: int, window: int, compact_threshold: float, hard_threshold: float
) -> WindowLevel:
    """The one window computation: `tokens` against `window` under a session's thresholds
    (ratios of the window)."""
    if window <= 0:
        return WindowLevel(
            tokens=tokens,
            window=max(window, 0),
            ratio=0.0,
            percent_used=0.0,
            near_limit=tokens > 0,
            at_limit=tokens > 0,
            level=HARD,
            compact_at=0,
            hard_at=0,
            compact_percent=round(100 * compact_threshold),
            hard_percent=round(100 * hard_threshold),
        )
    ratio = tokens / window
    near = ratio >= compact_threshold
    at = ratio >= hard_threshold
    return WindowLevel(
        tokens=tokens,
        window=window,
        ratio=ratio,
        percent_used=round(100 * ratio, 1),
        near_limit=near,
        at_limit=at,
        level=HARD if at else (APPROACHING if near else OK),
        compact_at=int(window * compact_threshold),
        hard_at=int(window * hard_threshold),
        compact_percent=round(100 * compact_threshold),
        hard_percent=round(100 * hard_threshold),
    )


ALWAYS_KEPT_TYPES = frozenset({EventType.SYSTEM_PROMPT, EventType.COMPACTION})
USER_TYPES = frozenset({EventType.USER_MESSAGE, EventType.CONTEXT_REFRESH})


# What names an item in the window math: an event's seq (the ledger), a message's index or
# any other id unique among the items.
Key = str | int


@dataclass(frozen=True)
class WindowItem:
    key: Key
    type: str
    cost: int
    tool_call_id: str = ""


def effective_limit(*, context_limit: int, max_tokens: int | None, reserve_tokens: int) -> int:
    """The tokens available for the prompt: the smaller of the window and the caller's cap,
    less what the caller reserves for the reply."""
    limit = min(context_limit, max_tokens) if max_tokens else context_limit
    return max(limit - reserve_tokens, 0)


def required_keys(items: Sequence[WindowItem]) -> list[Key]:
    """System prompts, the summary and the last user message: never pruned."""
    keys = [item.key for item in items if item.type in ALWAYS_KEPT_TYPES]
    last_user = next((item for item in reversed(items) if item.type in USER_TYPES), None)
    if last_user is not None:
        keys.append(last_user.key)
    return keys
