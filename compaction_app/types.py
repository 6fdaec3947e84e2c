"""Plain data passed between the ORM-facing services and the pure compaction code.

Strategies and summarizers never see model instances: the service layer converts stored
events into these frozen dataclasses, so the pure code can be tested without a database.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sessions_app.event_types import EventType

# Short names for the event types the pure code compares against (sessions_app.event_types is
# pure too, so this module stays importable without Django).
SYSTEM_PROMPT = EventType.SYSTEM_PROMPT
USER_MESSAGE = EventType.USER_MESSAGE
AGENT_MESSAGE = EventType.AGENT_MESSAGE
TOOL_CALL = EventType.TOOL_CALL
TOOL_RESULT = EventType.TOOL_RESULT
LOCAL_SYSTEM_MESSAGE = EventType.LOCAL_SYSTEM_MESSAGE
COMPACTION = EventType.COMPACTION
CONTEXT_REFRESH = EventType.CONTEXT_REFRESH


@dataclass(frozen=True)
class PlanEvent:
    """One event of a session's active context, as a strategy sees it.

    `token_count` is the exact stored cost of the message (overhead included); strategies
    add these numbers up and never re-tokenize.
    """

    id: str
    seq: int
    type: str
    token_count: int
    pinned: bool = False
    tool_call_id: str = ""
    name: str = ""
    content: str = ""


@dataclass(frozen=True)
class Budget:
    """What a strategy must reach.

    `context_limit` is the session's window; `target_tokens` the size the active context
    should be at or under after the run; the rest are the session's compaction settings.
    """

    context_limit: int
    target_tokens: int
    # The summary's bound (compaction_app/policy.py): the summary never holds more.
    max_summary_tokens: int = 256
    # The room rule: what the kept events and the summary's bound leave below this context
    # size (`fitTargetRatio` of the window) goes to the newest turns kept whole, then to more
    # lines in the placeholders of cleared outputs; never to the summary. None: no room.
    room_target_tokens: int | None = None
    # Outside the call path, recent work takes at most this share of what the context held
    # before the run (None: all of the room).
    recent_share: float | None = None
    keep_recent_events: int = 2
    # clear_tool_results keeps this many of the newest tool results untouched.
    keep_recent_tool_results: int = 3
    # The call path's compaction (gateway, fitTargetRatio): summarize folds older user turns
    # too until `target_tokens` is reached, not only until the window fits; the low-water
    # mark is what keeps the next compaction (and the next broken prefix) far away.
    strict_target: bool = False


@dataclass(frozen=True)
class ClearedResult:
    """A tool result whose content a `clear_tool_results` plan replaces by a placeholder."""

    event_id: str
    placeholder: str
    token_count: int  # exact cost of the placeholder message, computed by the strategy's counter
    tokens_freed: int


@dataclass(frozen=True)
class Plan:
    """The outcome of a strategy: which events to fold, and what the context costs after.

    `tokens_before` / `tokens_after` are context costs (sum of message costs plus the 3-token
    reply primer when any message remains). For `summarize`, `tokens_after` includes
    `summary_reserve_tokens`, the upper bound the new summary message may cost.
    """

    strategy: str
    fold_ids: tuple[str, ...] = ()
    cleared: tuple[ClearedResult, ...] = ()
    tokens_before: int = 0
    tokens_after: int = 0
    events_before: int = 0
    events_after: int = 0
    needs_summary: bool = False
    summary_reserve_tokens: int = 0
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def is_empty(self) -> bool:
        return not self.fold_ids and not self.cleared
