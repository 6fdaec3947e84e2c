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
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn, Protocol, TypeVar

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
from sessions_app.selectors import (
    EventHead,
    active_cost,
    active_heads,
    active_tail_heads,
    events_of,
    render_context,
)
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


def prune(
    items: Sequence[context_window.WindowItem], *, budget: int
) -> list[context_window.Key] | None:
    """The ledger's prune: the required items (system prompts, the summary, the last user
    message) and the newest units within `budget`, a tool call and its results being one
    unit so the result is a valid message list. The kept keys in input order, or None when
    the required items alone do not fit."""
    required = set(context_window.required_keys(items))
    units: list[list[context_window.Key]] = []
    by_call: dict[str, list[context_window.Key]] = {}
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


# --- the one sequence ------------------------------------------------------------------------


class Fittable(Protocol):
    """What one fitting works on: the ledger's active context (`/context`, the gateway's
    fallback) or one thread's own request (the gateway, gateway/thread_fit.py). Each answers
    the cost of what it would send now, compacts once, prunes to a budget and refuses."""

    def cost(self) -> int:
        """What sending it now costs (the context-cost rule, what goes out besides included)."""
        ...

    def compact(self) -> RunOutcome | None:
        """One compaction, re-reading what it left; None when none ran."""
        ...

    def prune(self, budget: int) -> bool:
        """Drop the oldest whole units until the cost is within `budget`; False when what must
        stay alone does not fit (nothing dropped then)."""
        ...

    def refuse(self) -> NoReturn:
        """Raise the refusal for what must stay not fitting the window."""
        ...


@dataclass(frozen=True)
class Fit:
    """What the sequence did: the cost it leaves, the level it decided on (after any
    compaction, before pruning), the run it made and whether it pruned."""

    tokens: int
    level: context_window.WindowLevel
    run: RunOutcome | None
    pruned: bool


def fit_sequence(
    subject: Fittable,
    *,
    window: int,
    policy: Policy,
    may_compact: Callable[[context_window.WindowLevel], bool],
    session_id: Any,
) -> Fit:
    """The one fitting sequence, for the ledger and for a thread alike: measure; past what
    `may_compact` allows, compact once and measure again; still at or past the compact
    threshold, prune the oldest whole units of this one call (the compact threshold's share
    of the window first, then the whole window; logged as `context_window_approaching`), and
    refuse when even what must stay does not fit."""
    tokens = subject.cost()
    level = policy.level(tokens=tokens, window=window)
    run: RunOutcome | None = None
    if may_compact(level):
        run = subject.compact()
        tokens = subject.cost()
        level = policy.level(tokens=tokens, window=window)
    pruned = False
    if level.level != OK:
        audit.info(
            "context_window_approaching %s",
            {"tokenCount": tokens, "limit": window},
            extra={"session_id": str(session_id), "tokenCount": tokens, "limit": window},
        )
        for budget in (level.compact_at, window):
            if subject.prune(budget):
                break
        else:
            subject.refuse()
        after = subject.cost()
        pruned = after < tokens
        tokens = after
    return Fit(tokens=tokens, level=level, run=run, pruned=pruned)


# --- the ledger's ladder ---------------------------------------------------------------------


def _items(heads: Sequence[EventHead]) -> tuple[context_window.WindowItem, ...]:
    return tuple(
        context_window.WindowItem(
            key=head.id, type=head.type, cost=head.cost, tool_call_id=head.tool_call_id
        )
        for head in heads
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


class _Ledger:
    """The ledger's active context as a `Fittable`, measured and pruned from its events'
    heads (no content): only what is kept is read whole, so a pruned view of a long session
    costs what it returns."""

    def __init__(
        self,
        *,
        session: Session,
        user: AbstractBaseUser | AnonymousUser,
        limit: int,
        trigger: str,
        target_ratio: float | None,
        respect_cooldown: bool,
    ) -> None:
        self.session = session
        self.user = user
        self.limit = limit
        self.trigger = trigger
        self.target_ratio = target_ratio
        self.respect_cooldown = respect_cooldown
        # Read on demand: measuring sums in the database, a prune reads the tail it can keep,
        # and only what is sent whole is read whole, so a pruned view of a long session
        # costs what it returns, not a row per event of the session.
        self._heads: list[EventHead] | None = None
        self._cost: int | None = None  # the database's sum, until heads are read

    @property
    def heads(self) -> list[EventHead]:
        if self._heads is None:
            self._heads = active_heads(session=self.session)
        return self._heads

    def cost(self) -> int:
        if self._heads is not None:
            return context_window.context_cost([head.cost for head in self._heads])
        if self._cost is None:
            events, tokens = active_cost(session=self.session)
            self._cost = tokens + token_counting.REPLY_PRIMER if events else 0
        return self._cost

    def compact(self) -> RunOutcome | None:
        # Compaction never folds the system prompt or the last user message: when those alone
        # exceed the window, compacting would write (and fire the memory flush) for a 422.
        _raise_if_exhausted(self.session, self.heads, self.limit, exclude_summary=True)
        run = compact_to_fit(
            session=self.session,
            user=self.user,
            trigger=self.trigger,
            target_ratio=self.target_ratio,
            respect_cooldown=self.respect_cooldown,
        )
        self._heads = active_heads(session=self.session)
        return run

    def prune(self, budget: int) -> bool:
        heads = self._heads
        if heads is None:
            # What a prune to `budget` can keep lies in the context's newest `budget` tokens
            # (with the calls of their results, the system prompts, the summary and the last
            # user message): only those heads are read. Kept only if the prune succeeds: a
            # larger budget then reads its own, longer tail.
            heads = active_tail_heads(session=self.session, covering=budget) or self.heads
        kept = prune(_items(heads), budget=budget)
        if kept is None:
            return False
        keep = set(kept)
        self._heads = [head for head in heads if head.id in keep]
        return True

    def refuse(self) -> NoReturn:
        _raise_if_exhausted(self.session, self.heads, self.limit, exclude_summary=False)
        raise AssertionError("unreachable: the must-keep events fit")

    def events(self) -> list[Event]:
        """The events kept, whole, in send order."""
        return events_of(session=self.session, heads=self.heads)


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
    limit = context_window.effective_limit(
        context_limit=session.context_limit,
        max_tokens=max_tokens,
        reserve_tokens=reserve_tokens,
    )
    policy = session_policy(session)
    # On the session's own window, crossing compactThreshold compacts once, down to
    # fitTargetRatio, instead of pruning another oldest slice on every call: what this returns
    # then stays the previous answer plus the new events until the next crossing (a client
    # that sends it keeps a stable prefix for the provider's cache). A client's own smaller
    # cap (maxTokens) keeps the per-call view, compacting only at the hard limit.
    own_window = max_tokens is None or max_tokens >= session.context_limit
    ledger = _Ledger(
        session=session,
        user=user,
        limit=limit,
        trigger=trigger or Trigger.HARD_LIMIT,
        target_ratio=(
            policy.call_path_ratio(window=limit, context_limit=session.context_limit)
            if own_window
            else None
        ),
        respect_cooldown=respect_cooldown,
    )

    def may_compact(level: context_window.WindowLevel) -> bool:
        if not compact or not ledger.cost() or level.level == OK:
            return False
        return own_window or level.level == HARD

    done = fit_sequence(
        ledger, window=limit, policy=policy, may_compact=may_compact, session_id=session.pk
    )
    events, tokens, level = ledger.events(), done.tokens, done.level.level
    run, pruned = done.run, done.pruned
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
    session: Session, heads: Sequence[EventHead], limit: int, *, exclude_summary: bool
) -> None:
    """422 `context_window_exhausted` when the must-keep events alone exceed `limit`.
    `exclude_summary`: count only what no compaction can shrink (before compacting)."""
    required = set(context_window.required_keys(_items(heads)))
    needed = context_window.context_cost(
        [
            head.cost
            for head in heads
            if head.id in required and not (exclude_summary and head.type == EventType.COMPACTION)
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
