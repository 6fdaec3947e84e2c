"""The fitting core: what a model is sent, decided against its window, in one place.

`/context` (GET and POST), the gateway's two fittings (the ledger's ladder in
gateway/fit.py, a thread's own request in gateway/thread_fit.py) and the synchronous
compactions they run all go through this module:

- `window_level`: the one window decision (ok / approaching / hard) of a cost against a
  window under a session's thresholds (`policy.Policy`);
- `keep_newest`: the one prune, keeping the newest whole units (a tool call with its
  results on the ledger, a turn in a thread's request) that fit next to what must stay;
- `compact_to_fit`: the one call-path compaction, a `RunOutcome` (typed, never an API dict);
- `fit_context`: the ledger's ladder (`/context`, and the gateway for what its threads do
  not cover), a `FitOutcome`.

Compaction owns fitting: this module may read and call sessions_app; sessions_app never
calls it (the REST `/context` view is compaction_app's, see compaction_app/api/context.py).
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser

from compaction_app import services
from compaction_app.models import CompactionRun, RunStatus, Trigger
from compaction_app.policy import Policy
from sessions_app import context_window
from sessions_app import tokens as token_counting
from sessions_app.errors import Conflict, Unprocessable
from sessions_app.event_types import EventType
from sessions_app.models import Event, Session
from sessions_app.render import Repair
from sessions_app.selectors import active_events, render_context
from sessions_app.session_settings import SessionSettings

logger = logging.getLogger("compaction_app.fitting")
audit = logging.getLogger("context")

OK = context_window.OK
APPROACHING = context_window.APPROACHING
HARD = context_window.HARD

K = TypeVar("K", bound=Hashable)


def session_policy(session: Session) -> Policy:
    """The session's compaction policy (compaction_app/policy.py), from its settings."""
    return Policy.of(SessionSettings.of(session.settings))


@dataclass(frozen=True)
class FitRequest:
    """What is fitted: `items` (in order; their costs are message costs) into `window`
    tokens under `policy`; `thread` names the gateway thread a compaction is scoped to ("":
    the whole ledger)."""

    window: int
    items: tuple[context_window.WindowItem, ...]
    policy: Policy
    thread: str = ""


@dataclass(frozen=True)
class RunOutcome:
    """A compaction run the fitting made, as fitting needs it (the API serialises `run`)."""

    run: CompactionRun
    status: str
    tokens_before: int | None
    tokens_after: int | None

    @classmethod
    def of(cls, run: CompactionRun) -> RunOutcome:
        return cls(
            run=run,
            status=run.status,
            tokens_before=run.tokens_before,
            tokens_after=run.tokens_after,
        )

    @property
    def completed(self) -> bool:
        return self.status == RunStatus.COMPLETED

    @property
    def shrank(self) -> bool:
        """Completed with figures to announce (CONTEXT_COMPRESSED)."""
        return self.completed and self.tokens_before is not None


@dataclass(frozen=True)
class FitOutcome:
    """The ledger's ladder's answer: the messages to send and how they were fitted."""

    messages: list[dict[str, Any]]
    system: str | None
    token_count: int
    limit: int
    pruned: bool
    summary: str | None
    level: str
    run: RunOutcome | None = None
    # At or past the compact threshold: a client should compact (POST /context, /compact)
    # rather than keep sending a pruned view.
    compaction_recommended: bool = False


# --- the decision and the prune (pure) --------------------------------------------------------


def window_level(*, tokens: int, window: int, policy: Policy) -> str:
    """OK below the compact threshold, APPROACHING between the thresholds, HARD at or above
    the hard threshold (an empty window counts as HARD): `context_window.window_level`'s."""
    return policy.level(tokens=tokens, window=window).level


def passes_through(*, tokens: int, window: int, policy: Policy, compacted: bool) -> bool:
    """Whether the gateway forwards the client's own messages as they are: the ledger holds
    exactly them (nothing compacted) and they fit under the compact threshold. Otherwise they
    come from the ledger (a compacted session's active context, pruned or compacted as
    needed)."""
    return not compacted and window_level(tokens=tokens, window=window, policy=policy) == OK


def measure(request: FitRequest, *, extra: int = 0) -> tuple[int, str]:
    """The request's cost (its items, plus `extra` sent besides them) and its level."""
    cost = context_window.context_cost([item.cost for item in request.items]) + extra
    return cost, window_level(tokens=cost, window=request.window, policy=request.policy)


def keep_newest(
    units: Sequence[Sequence[K]],
    *,
    costs: Mapping[K, int],
    required: Iterable[K],
    budget: int,
    extra: int = 0,
) -> set[K] | None:
    """The one prune: the `required` keys, then the newest whole `units` (oldest first in
    `units`) while the context cost of what is kept, plus `extra` sent besides, stays within
    `budget`. It stops at the first unit that does not fit, so the kept history is a
    contiguous recent tail rather than a patchwork. None when the required keys alone do not
    fit."""
    kept = set(required)
    total = sum(costs[key] for key in kept)
    if (total + token_counting.REPLY_PRIMER if kept else 0) + extra > budget:
        return None
    for unit in reversed(units):
        cost = sum(costs[key] for key in unit)
        if total + cost + token_counting.REPLY_PRIMER + extra > budget:
            break
        total += cost
        kept.update(unit)
    return kept


def prune(items: Sequence[context_window.WindowItem], *, budget: int) -> list[str] | None:
    """The ledger's prune: the required items (system prompts, the summary, the last user
    message) and the newest units within `budget`, a tool call and its results being one
    unit so the result is a valid message list. The kept keys in input order, or None when
    the required items alone do not fit."""
    required = set(context_window.required_keys(items))
    units: list[list[str]] = []
    by_call: dict[str, list[str]] = {}
    for item in items:
        if item.key in required:
            continue
        if item.tool_call_id and item.type in (EventType.TOOL_CALL, EventType.TOOL_RESULT):
            unit = by_call.get(item.tool_call_id)
            if unit is None:
                unit = by_call[item.tool_call_id] = []
                units.append(unit)
            unit.append(item.key)
        else:
            units.append([item.key])
    kept = keep_newest(
        units, costs={item.key: item.cost for item in items}, required=required, budget=budget
    )
    if kept is None:
        return None
    return [item.key for item in items if item.key in kept]


def prune_turns(
    *,
    kept: Sequence[int],
    costs: Mapping[int, int],
    fixed: frozenset[int],
    starts: frozenset[int],
    extra: int,
    budget: int,
) -> list[int] | None:
    """A thread's prune: drop the oldest whole turns of `kept` (a turn runs from one user
    message that is not a tool result to the next) until what stays, plus `extra` (the
    summary), costs at most `budget`. The `fixed` messages (system) and the last turn always
    stay; None when even they do not fit."""
    body = [i for i in kept if i not in fixed]
    if not body:
        return list(kept)
    turns: list[list[int]] = [[]]
    for index in body:
        if index in starts and turns[-1]:
            turns.append([])
        turns[-1].append(index)
    required = [i for i in kept if i in fixed] + turns.pop()
    chosen = keep_newest(turns, costs=costs, required=required, budget=budget, extra=extra)
    if chosen is None:
        return None
    return [i for i in kept if i in chosen]


# --- compaction in the call path -------------------------------------------------------------


def compact_to_fit(
    *,
    session: Session,
    user: AbstractBaseUser | AnonymousUser | None,
    trigger: str,
    target_ratio: float | None,
    thread: str = "",
    respect_cooldown: bool = False,
) -> RunOutcome | None:
    """One synchronous compaction so a request fits; None when none ran (the plan folds
    nothing, a run is already under way, or, with `respect_cooldown`, the session had a
    hard-limit run within its cooldown): the caller prunes instead."""
    if respect_cooldown and services.hard_limit_cooling_down(session=session):
        return None
    try:
        run = services.compaction_run_sync(
            session=session, user=user, trigger=trigger, target_ratio=target_ratio, thread=thread
        )
    except Conflict:
        return None
    return RunOutcome.of(run) if run is not None else None


# --- the ledger's ladder ---------------------------------------------------------------------


def _items(events: list[Event]) -> tuple[context_window.WindowItem, ...]:
    return tuple(
        context_window.WindowItem(
            key=str(event.id),
            type=event.type,
            cost=event.effective_token_count,
            tool_call_id=event.tool_call_id,
        )
        for event in events
    )


def _repair_cost(session: Session, events: list[Event], repairs: list[Repair]) -> int:
    counter = token_counting.counter_for_model(session.model)
    costs = {str(event.id): event.effective_token_count for event in events}
    delta = 0
    for repair in repairs:
        delta += token_counting.message_tokens(counter, role=repair.role, content=repair.content)
        if repair.replaces is not None:
            delta -= costs.get(repair.replaces, 0)
    return delta


def fit_context(
    *,
    session: Session,
    user: AbstractBaseUser | AnonymousUser,
    max_tokens: int | None = None,
    reserve_tokens: int = 0,
    fmt: str = "openai",
    trigger: str | None = None,
    compact: bool = False,
    respect_cooldown: bool = False,
) -> FitOutcome:
    """The messages to send next, from the ledger.

    Below the compact threshold: the whole active context. Over it, on the session's own
    window: one synchronous compaction down to `fitTargetRatio`, after which the context stays
    below the threshold for many calls. With a smaller `max_tokens` cap, between the
    thresholds: a pruned view that drops the oldest non-system events to get under the compact
    threshold (logged as `context_window_approaching`), and at the hard limit a synchronous
    compaction first. Pruning is also the last resort when no compaction can run. When the
    system prompt, summary and last user message alone do not fit: `context_window_exhausted`
    (422). `trigger` names the run's trigger (HARD_LIMIT when None).
    Only `compact=True` (POST /context, the gateway) may compact: a GET never writes, so a
    read or a cross-site navigation cannot start a run. `respect_cooldown` skips a run when
    the session had a hard-limit run within its cooldown (it prunes instead).
    """
    events = active_events(session=session)
    request = FitRequest(
        window=context_window.effective_limit(
            context_limit=session.context_limit,
            max_tokens=max_tokens,
            reserve_tokens=reserve_tokens,
        ),
        items=_items(events),
        policy=session_policy(session),
    )
    limit, policy = request.window, request.policy
    tokens, level = measure(request)
    run: RunOutcome | None = None
    # On the session's own window, crossing compactThreshold compacts once, down to
    # fitTargetRatio, instead of pruning another oldest slice on every call: what this returns
    # then stays the previous answer plus the new events until the next crossing (a client
    # that sends it keeps a stable prefix for the provider's cache). A client's own smaller
    # cap (maxTokens) keeps the per-call view, compacting only at the hard limit.
    own_window = max_tokens is None or max_tokens >= session.context_limit
    target_ratio = None
    if compact and own_window and level != OK and events:
        target_ratio = policy.call_path_ratio(window=limit, context_limit=session.context_limit)
    if compact and (level == HARD or target_ratio is not None) and events:
        # Compaction never folds the system prompt or the last user message: when those alone
        # exceed the window, compacting would write (and fire the memory flush) for a 422.
        _raise_if_exhausted(session, events, limit, exclude_summary=True)
        run = compact_to_fit(
            session=session,
            user=user,
            trigger=trigger or Trigger.HARD_LIMIT,
            target_ratio=target_ratio,
            respect_cooldown=respect_cooldown,
        )
        events = active_events(session=session)
        request = FitRequest(window=limit, items=_items(events), policy=policy)
        tokens, level = measure(request)
    pruned = False
    if level != OK and events:
        audit.info(
            "context_window_approaching %s",
            {"tokenCount": tokens, "limit": limit},
            extra={"session_id": str(session.pk), "tokenCount": tokens, "limit": limit},
        )
        kept = prune(request.items, budget=policy.level(tokens=tokens, window=limit).compact_at)
        if kept is None:
            kept = prune(request.items, budget=limit)
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
    return FitOutcome(
        messages=rendered.messages,
        system=rendered.system,
        token_count=tokens,
        limit=limit,
        pruned=pruned,
        summary=summary,
        level=level,
        run=run,
        compaction_recommended=level != OK,
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
