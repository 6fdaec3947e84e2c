"""Building the context a client should send next (the `/context` ladder)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser

from sessions_app import context_window
from sessions_app import tokens as token_counting
from sessions_app.errors import Unprocessable
from sessions_app.models import Event, EventType, Session
from sessions_app.render import Repair
from sessions_app.selectors import active_events, render_context
from sessions_app.session_settings import SessionSettings
from sessions_app.signals import context_hard_limit

logger = logging.getLogger("context")


@dataclass(frozen=True)
class PreparedContext:
    messages: list[dict[str, Any]]
    system: str | None
    token_count: int
    limit: int
    pruned: bool
    summary: str | None
    level: str
    compaction: dict[str, Any] | None = None
    # The context is at or past the compact threshold: a client should compact (POST
    # /context, /compact) rather than keep sending a pruned view.
    compaction_recommended: bool = False


def _items(events: list[Event]) -> list[context_window.WindowItem]:
    return [
        context_window.WindowItem(
            key=str(event.id),
            type=event.type,
            cost=event.effective_token_count,
            tool_call_id=event.tool_call_id,
        )
        for event in events
    ]


def _repair_cost(session: Session, events: list[Event], repairs: list[Repair]) -> int:
    counter = token_counting.counter_for_model(session.model)
    costs = {str(event.id): event.effective_token_count for event in events}
    delta = 0
    for repair in repairs:
        delta += token_counting.message_tokens(counter, role=repair.role, content=repair.content)
        if repair.replaces is not None:
            delta -= costs.get(repair.replaces, 0)
    return delta


def context_prepare(
    *,
    session: Session,
    user: AbstractBaseUser | AnonymousUser,
    max_tokens: int | None = None,
    reserve_tokens: int = 0,
    fmt: str = "openai",
    trigger: str | None = None,
    compact: bool = False,
    respect_cooldown: bool = False,
) -> PreparedContext:
    """The messages to send next.

    Below the compact threshold: the whole active context. Over it, on the session's own
    window: one synchronous compaction down to `fitTargetRatio` (through the
    `context_hard_limit` signal), after which the context stays below the threshold for many
    calls. With a smaller `max_tokens` cap, between the thresholds: a pruned view that drops
    the oldest non-system events to get under the compact threshold (logged as
    `context_window_approaching`), and at the hard limit a synchronous compaction first. Pruning
    is also the last resort when no compaction can run. When the system prompt,
    summary and last user message alone do not fit: `context_window_exhausted` (422).
    `trigger` names the hard-limit run's trigger (the receiver's default when None).
    Only `compact=True` (POST /context, the gateway) may compact: a GET never writes, so a
    read or a cross-site navigation cannot start a run. `respect_cooldown` lets the receiver
    skip a run when the session had a hard-limit run within its cooldown (it prunes instead).
    """
    limit = context_window.effective_limit(
        context_limit=session.context_limit, max_tokens=max_tokens, reserve_tokens=reserve_tokens
    )
    settings = SessionSettings.of(session.settings)
    compact_threshold = settings.compact_threshold
    hard_threshold = settings.hard_limit_threshold
    events = active_events(session=session)
    tokens = context_window.context_cost([event.effective_token_count for event in events])
    level = context_window.window_level(
        tokens=tokens,
        limit=limit,
        compact_threshold=compact_threshold,
        hard_threshold=hard_threshold,
    )
    compaction: dict[str, Any] | None = None
    # Only a compacting call (POST /context, the gateway) may compact. On the session's own
    # window, crossing compactThreshold compacts once, down to fitTargetRatio, instead of
    # pruning another oldest slice on every call: what this returns then stays the previous
    # answer plus the new events until the next crossing (a client that sends it keeps a
    # stable prefix for the provider's cache). A client's own smaller cap (maxTokens) keeps
    # the per-call view, compacting only at the hard limit.
    own_window = max_tokens is None or max_tokens >= session.context_limit
    target_ratio = None
    if compact and own_window and level != "ok" and events:
        ratio = min(settings.fit_target_ratio, compact_threshold)
        target = ratio * limit
        target_ratio = max(min(target / session.context_limit, 1.0), 0.01)
    if compact and (level == "hard" or target_ratio is not None) and events:
        # Compaction never folds the system prompt or the last user message: when those alone
        # exceed the window, compacting would write (and fire the memory flush) for a 422.
        _raise_if_exhausted(session, events, limit, exclude_summary=True)
        for _receiver, response in context_hard_limit.send(
            sender=Session,
            session=session,
            user=user,
            limit=limit,
            trigger=trigger,
            target_ratio=target_ratio,
            respect_cooldown=respect_cooldown,
        ):
            if isinstance(response, dict):
                compaction = response
                break
        events = active_events(session=session)
        tokens = context_window.context_cost([event.effective_token_count for event in events])
        level = context_window.window_level(
            tokens=tokens,
            limit=limit,
            compact_threshold=compact_threshold,
            hard_threshold=hard_threshold,
        )
    pruned = False
    recommended = level != "ok"
    if level != "ok" and events:
        logger.info(
            "context_window_approaching %s",
            {"tokenCount": tokens, "limit": limit},
            extra={"session_id": str(session.pk), "tokenCount": tokens, "limit": limit},
        )
        kept = context_window.prune(_items(events), budget=int(limit * compact_threshold))
        if kept is None:
            kept = context_window.prune(_items(events), budget=limit)
        if kept is None:
            _raise_if_exhausted(session, events, limit, exclude_summary=False)
            kept = []  # unreachable: the must-keep items exceed the budget
        keep = set(kept)
        pruned = len(keep) < len(events)
        events = [event for event in events if str(event.id) in keep]
        tokens = context_window.context_cost([event.effective_token_count for event in events])
    rendered = render_context(events, fmt=fmt)
    if rendered.repairs:
        # The renderer rewrote or added messages to keep the list valid: price them, so
        # tokenCount is the cost of what is actually sent.
        tokens += _repair_cost(session, events, rendered.repairs)
    summary = next((event.content for event in events if event.type == EventType.COMPACTION), None)
    return PreparedContext(
        messages=rendered.messages,
        system=rendered.system,
        token_count=tokens,
        limit=limit,
        pruned=pruned,
        summary=summary,
        level=level,
        compaction=compaction,
        compaction_recommended=recommended,
    )


def _raise_if_exhausted(
    session: Session, events: list[Event], limit: int, *, exclude_summary: bool
) -> None:
    """422 `context_window_exhausted` when the must-keep events alone exceed `limit`.
    `exclude_summary`: count only what no compaction can shrink (before compacting)."""
    required = set(context_window.required_keys(_items(events)))
    needed = context_window.context_cost(
        [
            event.effective_token_count
            for event in events
            if str(event.id) in required
            and not (exclude_summary and event.type == EventType.COMPACTION)
        ]
    )
    if needed > limit:
        raise Unprocessable(
            "the system prompt, summary and last message alone exceed the context window",
            code="context_window_exhausted",
            tokenCount=needed,
            limit=limit,
            model=session.model,
        )
