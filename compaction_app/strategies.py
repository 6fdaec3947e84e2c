"""Compaction strategies: pure functions from a session's active context and a budget to a Plan.

No Django, no ORM, no tokenizer calls (except `clear_tool_results`, which must price its
placeholders exactly and therefore takes a `count_tokens` callable). Every strategy:

* never folds a SYSTEM_PROMPT event, the latest USER_MESSAGE, or a pinned event;
* folds a TOOL_CALL together with every TOOL_RESULT sharing its `tool_call_id`, or none of them
  (a group with a pinned member is therefore never folded);
* returns an empty Plan (not an error) when there is nothing worth doing;
* reports `tokens_after` exactly, from the stored `token_count`s.

Context cost = sum of message costs + 3 (reply primer) when any message remains, else 0.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Protocol

# OpenAI's chat accounting; sessions_app.tokens is pure (tiktoken loads lazily), no Django.
from sessions_app.tokens import MESSAGE_OVERHEAD, REPLY_PRIMER, context_tokens

from . import relevance
from .types import (
    AGENT_MESSAGE,
    COMPACTION,
    CONTEXT_REFRESH,
    SYSTEM_PROMPT,
    TOOL_CALL,
    TOOL_RESULT,
    USER_MESSAGE,
    Budget,
    ClearedResult,
    Plan,
    PlanEvent,
)

__all__ = [
    "REPLY_PRIMER",
    "MESSAGE_OVERHEAD",
    "SUMMARY_MESSAGE_OVERHEAD",
    "CLEARED_PREFIX",
    "STRATEGIES",
    "StrategyFn",
    "clear_tool_results",
    "context_cost",
    "kept_lines",
    "plan_compaction",
    "strategy_names",
    "summarize",
    "tool_placeholder",
    "trim",
]

TokenCounter = Callable[[str], int]

# The summary message's cost beyond its text: 3 (message framing) + tokens of its role
# ("system" is 1 token in cl100k/o200k) plus slack for a name or a short heading the service may
# add. The service must truncate the summary text so that the *whole* summary message costs at
# most `Plan.summary_reserve_tokens` = max_summary_tokens + SUMMARY_MESSAGE_OVERHEAD; that is
# what makes `tokens_after` of a summarize plan an exact upper bound.
SUMMARY_MESSAGE_OVERHEAD = 8

# Content of a cleared tool result starts with this, so a later run recognises it.
CLEARED_PREFIX = "[tool result cleared:"

_USER_TYPES = frozenset({USER_MESSAGE, CONTEXT_REFRESH})


class StrategyFn(Protocol):
    def __call__(
        self,
        *,
        events: Sequence[PlanEvent],
        budget: Budget,
        count_tokens: TokenCounter | None = None,
    ) -> Plan: ...


def context_cost(events: Sequence[PlanEvent]) -> int:
    """Cost of sending `events` as a context: their stored costs plus the reply primer."""
    return context_tokens(e.token_count for e in events)


def _cost_of(total: int, count: int) -> int:
    return total + REPLY_PRIMER if count else 0


# --- shared analysis ---------------------------------------------------------------------------


class _Unit:
    """Events that fold together: one event, or a tool call with its results."""

    __slots__ = ("events", "cost", "locked")

    def __init__(self, events: list[PlanEvent], *, latest_user: str | None) -> None:
        self.events = events
        self.cost = sum(e.token_count for e in events)
        # Contains something that must never be folded.
        self.locked = any(
            e.pinned or e.type == SYSTEM_PROMPT or e.id == latest_user for e in events
        )

    @property
    def ids(self) -> list[str]:
        return [e.id for e in self.events]

    @property
    def types(self) -> set[str]:
        return {e.type for e in self.events}


def _latest_user_id(events: Sequence[PlanEvent]) -> str | None:
    for event in reversed(events):
        if event.type == USER_MESSAGE:
            return event.id
    return None


def _units(events: Sequence[PlanEvent]) -> Iterator[_Unit]:
    """Fold units, lazily, in order of their first event.

    A TOOL_CALL and its TOOL_RESULTs share a unit; a result whose call is no longer in the
    context (folded earlier) stands alone. System prompts, the latest user message and pinned
    events lock their unit. Lazy so that trim, which usually stops early, builds few units.
    """
    latest_user = _latest_user_id(events)
    call_ids = {e.tool_call_id for e in events if e.type == TOOL_CALL and e.tool_call_id}
    groups: dict[str, list[PlanEvent]] = {}
    if call_ids:
        for event in events:
            if event.tool_call_id in call_ids and event.type in (TOOL_CALL, TOOL_RESULT):
                groups.setdefault(event.tool_call_id, []).append(event)
    emitted: set[str] = set()
    for event in events:
        key = event.tool_call_id
        if key in groups and event.type in (TOOL_CALL, TOOL_RESULT):
            if key in emitted:
                continue
            emitted.add(key)
            yield _Unit(groups[key], latest_user=latest_user)
        else:
            yield _Unit([event], latest_user=latest_user)


def _sorted(events: Sequence[PlanEvent]) -> list[PlanEvent]:
    items = list(events)
    if any(items[i].seq > items[i + 1].seq for i in range(len(items) - 1)):
        items.sort(key=lambda e: e.seq)
    return items


def _plan(
    *,
    strategy: str,
    events: Sequence[PlanEvent],
    folded: set[str],
    extra_after: int = 0,
    extra_events: int = 0,
    notes: Sequence[str] = (),
    **fields: object,
) -> Plan:
    kept = [e for e in events if e.id not in folded]
    kept_total = sum(e.token_count for e in kept) + extra_after
    kept_count = len(kept) + extra_events
    return Plan(
        strategy=strategy,
        fold_ids=tuple(e.id for e in events if e.id in folded),
        tokens_before=context_cost(events),
        tokens_after=_cost_of(kept_total, kept_count),
        events_before=len(events),
        events_after=kept_count,
        notes=tuple(notes),
        **fields,  # type: ignore[arg-type]
    )


# --- trim ------------------------------------------------------------------------------------


def trim(
    *,
    events: Sequence[PlanEvent],
    budget: Budget,
    count_tokens: TokenCounter | None = None,
) -> Plan:
    """Fold the oldest foldable events until the context is at or under `budget.target_tokens`.

    Foldable: anything but system prompts, the latest user message and pinned events (tool
    groups move as one). The existing summary (COMPACTION event) is folded like any other old
    event. Folding stops as soon as the target is reached, so no more is dropped than needed.
    If the target cannot be reached, everything foldable is folded and a note says so. No
    summary is produced.
    """
    del count_tokens  # trim prices nothing new
    events = _sorted(events)
    total = sum(e.token_count for e in events)
    remaining = len(events)
    target = budget.target_tokens
    folded: set[str] = set()
    notes: list[str] = []
    if _cost_of(total, remaining) > target:
        for unit in _units(events):
            if _cost_of(total, remaining) <= target:
                break
            if unit.locked:
                continue
            folded.update(unit.ids)
            total -= unit.cost
            remaining -= len(unit.events)
        after = _cost_of(total, remaining)
        if after > target:
            notes.append(
                f"target {target} unreachable: the events that must be kept cost {after} tokens"
            )
    return _plan(strategy="trim", events=events, folded=folded, notes=notes)


# --- summarize -------------------------------------------------------------------------------


def summarize(
    *,
    events: Sequence[PlanEvent],
    budget: Budget,
    count_tokens: TokenCounter | None = None,
) -> Plan:
    """Fold older agent / tool events into a new running summary, bounded, and keep the newest
    turns whole in the room the target leaves.

    Kept: system prompts, every user message (USER_MESSAGE, CONTEXT_REFRESH), pinned events,
    the `budget.keep_recent_events` newest foldable events (rounded up to whole tool groups),
    and then, newest first, whole turns (an agent message with the tool calls it made and
    their results) while they fit the room: `budget.room_target_tokens` less what is kept and
    the summary's bound, and outside the call path at most `budget.recent_share` of the
    context before. The kept tail is contiguous: the fill stops at the first turn that does
    not fit. Everything older is folded, and so is the existing summary (COMPACTION event),
    which the new summary supersedes. The summary message is reserved
    `max_summary_tokens + SUMMARY_MESSAGE_OVERHEAD` tokens: the summary never grows into the
    room.

    The kept events plus that reserve must fit `budget.context_limit` (with
    `budget.strict_target`, `budget.target_tokens`); when they do not, the oldest user
    messages are folded too (never the latest), then the oldest of the recent events. If
    nothing folds, the plan is empty.
    """
    del count_tokens
    events = _sorted(events)
    reserve = max(budget.max_summary_tokens, 0) + SUMMARY_MESSAGE_OVERHEAD
    units = list(_units(events))

    def is_agent_unit(unit: _Unit) -> bool:
        return not (unit.types & (_USER_TYPES | {SYSTEM_PROMPT, COMPACTION}))

    # Agent / tool units, newest first: the `keep_recent_events` newest are kept, the rest
    # folded (some come back below, in the room).
    keep_n = max(budget.keep_recent_events, 0)
    recent: list[_Unit] = []
    older: list[_Unit] = []  # newest first
    kept_events = 0
    folded: set[str] = set()
    for unit in reversed(units):
        if unit.locked or not is_agent_unit(unit):
            continue
        if kept_events < keep_n:
            recent.append(unit)
            kept_events += len(unit.events)
        else:
            older.append(unit)
            folded.update(unit.ids)
    recent.reverse()

    summaries = [u for u in units if COMPACTION in u.types and not u.locked]
    kept_total = sum(e.token_count for e in events if e.id not in folded) - sum(
        u.cost for u in summaries
    )

    limit = (
        min(budget.context_limit, budget.target_tokens)
        if budget.strict_target
        else budget.context_limit
    )

    def fits() -> bool:
        return kept_total + reserve + REPLY_PRIMER <= limit

    notes: list[str] = []
    if not fits():
        # Over the window even after folding all old agent work: older user turns go next,
        # then the recent agent work we meant to keep.
        user_units = [u for u in units if not u.locked and u.types & _USER_TYPES]
        folded_users = folded_recent = 0
        for unit in user_units + recent:
            if fits():
                break
            folded.update(unit.ids)
            kept_total -= unit.cost
            if unit.types & _USER_TYPES:
                folded_users += 1
            else:
                folded_recent += len(unit.events)
        if folded_users:
            notes.append(
                f"kept events did not fit the window: {folded_users} older user message(s) folded"
            )
        if folded_recent:
            notes.append(
                f"kept events did not fit the window: {folded_recent} recent event(s) folded"
            )
        if not fits():
            notes.append(
                f"context limit {budget.context_limit} unreachable: kept events cost "
                f"{kept_total} tokens plus a {reserve}-token summary reserve"
            )
    elif older:
        # The room rule: recent work, whole turns, newest first, contiguous.
        room = _recent_room(
            budget,
            kept_total=kept_total,
            reserve=reserve,
            work=sum(u.cost for u in older) + sum(u.cost for u in recent),
        )
        for turn in _turns_newest_first(older):
            cost = sum(u.cost for u in turn)
            if cost > room:
                break
            room -= cost
            kept_total += cost
            for unit in turn:
                folded.difference_update(unit.ids)

    if not folded:
        return _plan(strategy="summarize", events=events, folded=set(), notes=notes)
    for unit in summaries:
        folded.update(unit.ids)
    return _plan(
        strategy="summarize",
        events=events,
        folded=folded,
        extra_after=reserve,
        extra_events=1,
        notes=notes,
        needs_summary=True,
        summary_reserve_tokens=reserve,
    )


def _recent_room(budget: Budget, *, kept_total: int, reserve: int, work: int) -> int:
    """The room recent work may take: what the kept events and the summary's reserve leave
    below `budget.room_target_tokens` (never past the window), and outside the call path at
    most `budget.recent_share` of the agent's and the tools' work (`work`, the tokens of the
    foldable agent / tool events): the rest of that work is folded, so the run compacts."""
    if budget.room_target_tokens is None:
        return 0
    target = min(budget.room_target_tokens, budget.context_limit)
    if budget.strict_target:
        target = min(target, budget.target_tokens)
    room = target - kept_total - reserve - REPLY_PRIMER
    if budget.recent_share is not None:
        room = min(room, int(work * budget.recent_share))
    return max(room, 0)


def _turns_newest_first(older: Sequence[_Unit]) -> Iterator[list[_Unit]]:
    """`older` (agent / tool units, newest first) grouped into turns: the tool calls of one
    assistant message (their events interleave: calls first, then results) go together, with
    the agent message just before them (the words a model said beside its calls)."""
    pending: list[_Unit] = []
    for unit in older:
        if pending and not _same_turn(unit, pending[-1]):
            yield list(reversed(pending))
            pending = []
        pending.append(unit)
    if pending:
        yield list(reversed(pending))


def _same_turn(earlier: _Unit, later: _Unit) -> bool:
    """Whether `earlier` belongs to `later`'s assistant message: parallel calls whose events
    interleave, or the agent message right before a call."""
    if not _is_call_group(later):
        return False
    first = min(e.seq for e in later.events)
    last_of_earlier = max(e.seq for e in earlier.events)
    if _is_call_group(earlier):
        return last_of_earlier > first
    return earlier.types == {AGENT_MESSAGE} and last_of_earlier == first - 1


def _is_call_group(unit: _Unit) -> bool:
    return TOOL_CALL in unit.types


# --- clear_tool_results ----------------------------------------------------------------------


# What a cleared tool result keeps of its output: its verdicts (its failures, outcomes and a
# diff's added lines the routine does not repeat), then its records the conversation points at
# (compaction_app/relevance.py, the ranking the local summarizer quotes from): what answers the
# request it served, what the agent later named or reacted to, the verdict among its siblings
# (the pod in CrashLoopBackOff, the TSnnnn error at file:line:col, `BUILD FAILED in …`). Their
# text is bounded by the smaller of two limits, so clearing still frees most of what it touches
# (a heavier placeholder would leave the call path short of `fitTargetRatio` more often):
# * half the output's tokens: clearing frees about half or more of every output it clears;
# * 160 tokens: 4-8 lines, room for the few facts an output is cleared for; past 320 tokens
#   the share no longer binds, so an output of 2,000 tokens still frees over 90 % and a
#   20k-token log keeps 160 tokens, not thousands (search and recall hold the rest).
# Routine output nobody pointed at keeps nothing: its placeholder names it (tool, seq, tokens).
KEPT_MAX_SHARE = 0.5
KEPT_MAX_TOKENS = 160
KEPT_POINTED_TOKENS = 400
_KEPT_HEADING = "; kept lines:"
# The least relevance score a record the conversation points at needs to be kept in a
# placeholder, unless a later message or call names it (mention >= 0.5, `Ranked.pointed_at`'s
# own bar: the line the agent went on to act on); with room, the others follow.
_KEPT_CUT = 1.5


def tool_placeholder(
    *, name: str, tokens_freed: int, kept: Sequence[str] = (), seq: int = 0
) -> str:
    """The text that replaces a cleared tool result: the tool, its seq as a summary cites one
    (`[#42]`: `ledger_recall` with `seqs: [42]` returns the output whole), the tokens freed
    and, when any are kept, the output's most telling records, one a line, in their order in
    the output."""
    cite = f" [#{seq}]" if seq > 0 else ""
    head = f"{CLEARED_PREFIX} {name or 'tool'} output{cite}, {tokens_freed} tokens freed"
    if not kept:
        return f"{head}]"
    return head + _KEPT_HEADING + "]" + _kept_block(kept)


def kept_lines(
    count_tokens: TokenCounter,
    *,
    event: PlanEvent,
    outcome: relevance.Outcome,
    verdicts: Sequence[relevance.Ranked] = (),
    room: int | None = None,
) -> tuple[str, ...]:
    """The records of `event`'s output its placeholder keeps: its `verdicts` first (its
    failures and outcomes the routine does not repeat, `Conversation.verdict_lines`: what a
    summary of it would state too), then best first by `outcome` (the output's ranking by
    what the conversation says of it) those it points at (and, with more `room` than the
    default, the next ones), while their text stays within `room` (default:
    min(`KEPT_MAX_SHARE` of the output's tokens, `KEPT_MAX_TOKENS`)), then put back in their
    order in the output. Deterministic: same session, same lines."""
    # By identity: `verdicts` are records of this very ranking (comparing them by value
    # would compare their records' texts, once per record of the output).
    verdict_ids = {id(r) for r in verdicts}
    pointed = list(verdicts) + [
        r
        for r in outcome.ranked
        if r.pointed_at and (r.score >= _KEPT_CUT or r.mention >= 0.5) and id(r) not in verdict_ids
    ]
    grown = room is not None and room > KEPT_MAX_TOKENS
    if room is None:
        # The verdicts and the records the conversation points at, up to
        # KEPT_POINTED_TOKENS: an output the agent worked from keeps what it worked from and
        # what it concluded; one nobody looked at that concluded nothing keeps nothing.
        wanted = sum(len(r.record.quoted) // 4 + 2 for r in pointed)
        room = min(
            int(event.token_count * KEPT_MAX_SHARE),
            max(KEPT_MAX_TOKENS, min(wanted, KEPT_POINTED_TOKENS)),
        )
    if room <= 0:
        return ()
    # With room to give, the rest of the output follows in rank order: the room is there to
    # keep more of what the model saw.
    pointed_ids = {id(r) for r in pointed}
    offered = pointed + ([r for r in outcome.ranked if id(r) not in pointed_ids] if grown else [])
    chosen: list[tuple[int, str]] = []
    used = 0
    for ranked in offered:
        line = ranked.record.quoted
        if not line or any(line == kept for _, kept in chosen):
            continue
        # Each line costs its tokens plus its newline (one token in cl100k/o200k); measured
        # alone so the bound never depends on how neighbouring lines merge into tokens.
        cost = count_tokens(line) + 1
        if used + cost > room:
            continue  # a shorter, lower-ranked line may still fit
        chosen.append((ranked.record.index, line))
        used += cost
    # The bound holds for the block as the placeholder writes it (a line ending in punctuation
    # may share a token with its newline): drop the lowest-ranked lines until it does.
    while chosen and count_tokens(_kept_block(line for _, line in sorted(chosen))) > room:
        chosen.pop()
    return tuple(line for _, line in sorted(chosen))


def _all_verdict(
    count_tokens: TokenCounter, *, event: PlanEvent, verdicts: Sequence[relevance.Ranked]
) -> bool:
    """Whether an output is mostly its verdicts (a compiler's four errors, a test run's
    failure): its placeholder would keep them all and free little, or drop some and lose
    what the output concluded. Such an output stays whole; clearing frees the rest."""
    limit = event.token_count * KEPT_MAX_SHARE
    used = 0
    for ranked in verdicts:
        used += count_tokens(ranked.record.quoted) + 1
        if used > limit:
            return True
    return False


def _kept_block(lines: Iterable[str]) -> str:
    return "".join(f"\n{line}" for line in lines)


def _placeholder_cost(count_tokens: TokenCounter, *, name: str, text: str) -> int:
    cost = MESSAGE_OVERHEAD + count_tokens("tool") + count_tokens(text)
    return cost + count_tokens(name) if name else cost


def _price_placeholder(
    count_tokens: TokenCounter, *, event: PlanEvent, kept: Sequence[str] = ()
) -> tuple[str, int, int] | None:
    """(placeholder, its exact message cost, tokens freed), or None when it would not save.

    The placeholder states the tokens it frees, which depends on its own cost: iterate to the
    fixed point (one or two steps in practice; the digits of a number barely move its cost).
    If a digit boundary makes it oscillate, the last text is kept and `tokens_freed` stays
    exact even if the stated number is off by one. Kept lines are dropped when, with them,
    the placeholder would not save tokens.
    """
    freed = event.token_count
    text, cost = "", 0
    for _ in range(6):
        text = tool_placeholder(
            name=event.name, tokens_freed=max(freed, 0), kept=kept, seq=event.seq
        )
        cost = _placeholder_cost(count_tokens, name=event.name, text=text)
        if event.token_count - cost == freed:
            break
        freed = event.token_count - cost
    freed = event.token_count - cost
    if freed <= 0:
        return _price_placeholder(count_tokens, event=event) if kept else None
    return text, cost, freed


def clear_tool_results(
    *,
    events: Sequence[PlanEvent],
    budget: Budget,
    count_tokens: TokenCounter | None = None,
) -> Plan:
    """Replace the content of older tool results by a short placeholder; fold nothing.

    The `budget.keep_recent_tool_results` newest TOOL_RESULT events stay untouched, pinned
    results are skipped, and so is any result whose placeholder would not save tokens (already
    cleared ones included). The placeholder names the tool and the tokens freed; its message
    cost (`3 + tokens("tool") + tokens(placeholder) [+ tokens(name)]`) is computed exactly
    with `count_tokens`, which is therefore required. No model call.
    """
    if count_tokens is None:
        raise ValueError("clear_tool_results needs count_tokens to price its placeholders")
    events = _sorted(events)
    results = [e for e in events if e.type == TOOL_RESULT]
    keep = max(budget.keep_recent_tool_results, 0)
    older = results[: len(results) - keep] if keep else results
    cleared: list[ClearedResult] = []
    conversation: relevance.Conversation | None = None
    position = {e.id: k for k, e in enumerate(events)}
    outcomes: list[tuple[relevance.Outcome, list[relevance.Ranked]]] = []
    clearable: list[PlanEvent] = []
    for event in older:
        # Re-clearing a placeholder could "save" a token by shrinking its number: pointless churn.
        if event.pinned or event.content.startswith(CLEARED_PREFIX):
            continue
        if conversation is None:
            # What the conversation says of each output: built once over the whole context
            # being compacted, and only when something is cleared.
            conversation = relevance.Conversation(
                [
                    relevance.Message(
                        type=e.type,
                        content=e.content,
                        seq=e.seq,
                        name=e.name,
                        tool_call_id=e.tool_call_id,
                    )
                    for e in events
                ]
            )
        outcome = conversation.rank(position[event.id], repeated_failures=False)
        verdicts = conversation.verdict_lines(outcome)
        if _all_verdict(count_tokens, event=event, verdicts=verdicts):
            continue
        kept = kept_lines(count_tokens, event=event, outcome=outcome, verdicts=verdicts)
        priced = _price_placeholder(count_tokens, event=event, kept=kept)
        if priced is None:
            continue
        text, cost, freed = priced
        clearable.append(event)
        outcomes.append((outcome, verdicts))
        cleared.append(
            ClearedResult(event_id=event.id, placeholder=text, token_count=cost, tokens_freed=freed)
        )
    before = context_cost(events)
    if conversation is not None and cleared:
        room = _clearing_room(
            budget,
            after=before - sum(c.tokens_freed for c in cleared),
            work=sum(e.token_count for e in clearable),
        )
        # The room rule: the newest outputs come back whole first (newest first, while they
        # fit, contiguous), then the placeholders left keep more of their lines.
        while cleared and cleared[-1].tokens_freed <= room:
            room -= cleared[-1].tokens_freed
            cleared.pop()
            clearable.pop()
            outcomes.pop()
        if cleared:
            cleared = _grow_into_room(
                count_tokens,
                cleared=cleared,
                events=clearable,
                outcomes=outcomes,
                room=room,
            )
    return Plan(
        strategy="clear_tool_results",
        cleared=tuple(cleared),
        tokens_before=before,
        tokens_after=before - sum(c.tokens_freed for c in cleared),
        events_before=len(events),
        events_after=len(events),
    )


def _clearing_room(budget: Budget, *, after: int, work: int) -> int:
    """The room clearing leaves below its target (`room_target_tokens`, else the run's
    target) for recent outputs kept whole and fuller placeholders; outside the call path at
    most `recent_share` of the outputs it clears (`work`)."""
    target = budget.room_target_tokens
    if target is None:
        target = budget.target_tokens
    target = min(target, budget.target_tokens, budget.context_limit)
    room = target - after
    if budget.recent_share is not None:
        room = min(room, int(work * budget.recent_share))
    return max(room, 0)


# Of the room clearing leaves below its target, what placeholders may take back (the rest is
# slack for the digits of the freed counts and for the next turns).
ROOM_SHARE = 0.9
# With room, an output may keep every line that outranks routine, up to this share of its
# tokens: a placeholder still says what was cleared, and the routine lines are what goes.
ROOM_MAX_SHARE = 0.9


def _grow_into_room(
    count_tokens: TokenCounter,
    *,
    cleared: list[ClearedResult],
    events: list[PlanEvent],
    outcomes: list[tuple[relevance.Outcome, list[relevance.Ranked]]],
    room: int,
) -> list[ClearedResult]:
    """Placeholders that keep more of their outputs when clearing leaves room below the target
    (the newest outputs kept whole came first): the room is shared out by what each output
    holds, weighted by what the conversation points at, not evenly; each keeps its records
    best first."""
    room = int(room * ROOM_SHARE)
    if room <= 0:
        return cleared
    worth: list[int] = []
    for outcome, _ in outcomes:
        # Its records' size, weighted by how much the conversation points at each: an output
        # of facts the agent worked from gets a larger share than a routine listing.
        worth.append(
            int(sum(len(r.record.quoted) * (1 + max(r.score, 0)) for r in outcome.ranked) // 4)
        )
    total = sum(worth)
    if total <= 0:
        return cleared
    grown: list[ClearedResult] = []
    spent = 0
    for result, event, value, (outcome, verdicts) in zip(
        cleared, events, worth, outcomes, strict=True
    ):
        base = min(int(event.token_count * KEPT_MAX_SHARE), KEPT_MAX_TOKENS)
        # The placeholder's own words (tool, tokens freed) cost about 20 tokens.
        share = min(int(event.token_count * ROOM_MAX_SHARE) - 24, base + room * value // total)
        if share <= base or value <= 0:
            grown.append(result)
            continue
        kept = kept_lines(count_tokens, event=event, outcome=outcome, verdicts=verdicts, room=share)
        priced = _price_placeholder(count_tokens, event=event, kept=kept)
        if priced is None or (kept and _KEPT_HEADING not in priced[0]):
            # Kept whole it would save nothing: the baseline placeholder stands.
            grown.append(result)
            continue
        text, cost, freed = priced
        extra = cost - result.token_count
        if spent + extra > room:
            grown.append(result)
            continue
        spent += extra
        grown.append(
            ClearedResult(event_id=event.id, placeholder=text, token_count=cost, tokens_freed=freed)
        )
    return grown


# --- registry --------------------------------------------------------------------------------

STRATEGIES: dict[str, StrategyFn] = {
    "trim": trim,
    "summarize": summarize,
    "clear_tool_results": clear_tool_results,
}


def strategy_names() -> list[str]:
    return sorted(STRATEGIES)


def plan_compaction(
    *,
    strategy: str,
    events: Sequence[PlanEvent],
    budget: Budget,
    count_tokens: TokenCounter | None = None,
) -> Plan:
    """Plan a compaction of the active context `events` (seq order) with `strategy`.

    Raises KeyError for an unknown strategy name.
    """
    try:
        fn = STRATEGIES[strategy]
    except KeyError:
        raise KeyError(f"unknown strategy {strategy!r}") from None
    return fn(events=events, budget=budget, count_tokens=count_tokens)
