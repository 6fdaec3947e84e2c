"""Compaction strategies: invariants over generated sessions, plus worked examples."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compaction_app.strategies import (
    STRATEGIES,
    SUMMARY_MESSAGE_OVERHEAD,
    plan_compaction,
    strategy_names,
    tool_placeholder,
)
from compaction_app.types import (
    AGENT_MESSAGE,
    COMPACTION,
    CONTEXT_REFRESH,
    SYSTEM_PROMPT,
    TOOL_CALL,
    TOOL_RESULT,
    USER_MESSAGE,
    Budget,
    Plan,
    PlanEvent,
)

pytestmark = pytest.mark.profile_independent


def words(text: str) -> int:
    return len(text.split())


def primer(total: int, count: int) -> int:
    return total + 3 if count else 0


def cost(events: Sequence[PlanEvent]) -> int:
    return primer(sum(e.token_count for e in events), len(events))


class Builder:
    """Appends events with consecutive seqs and readable ids."""

    def __init__(self) -> None:
        self.events: list[PlanEvent] = []

    def add(
        self,
        type_: str,
        tokens: int,
        *,
        pinned: bool = False,
        call: str = "",
        name: str = "",
        content: str = "",
    ) -> PlanEvent:
        seq = len(self.events) + 1
        event = PlanEvent(
            id=f"e{seq}",
            seq=seq,
            type=type_,
            token_count=tokens,
            pinned=pinned,
            tool_call_id=call,
            name=name,
            content=content,
        )
        self.events.append(event)
        return event


# --- generated sessions ----------------------------------------------------------------------

_ITEM = st.sampled_from(
    ["user", "user", "agent", "agent", "tool", "tool", "tool2", "refresh", "orphan", "bare_call"]
)


@st.composite
def sessions(draw: st.DrawFn) -> list[PlanEvent]:
    b = Builder()
    tokens = st.integers(min_value=1, max_value=400)
    if draw(st.booleans()):
        b.add(SYSTEM_PROMPT, draw(tokens))
    if draw(st.booleans()):
        b.add(COMPACTION, draw(tokens), pinned=draw(st.sampled_from([False] * 5 + [True])))
    items = draw(st.lists(_ITEM, max_size=30))
    for n, item in enumerate(items):
        pin = draw(st.integers(min_value=0, max_value=6)) == 0
        words_ = draw(st.integers(min_value=1, max_value=3000))
        content = " ".join(["w"] * words_)
        if item == "user":
            b.add(USER_MESSAGE, draw(tokens), pinned=pin)
        elif item == "refresh":
            b.add(CONTEXT_REFRESH, draw(tokens), pinned=pin)
        elif item == "agent":
            b.add(AGENT_MESSAGE, draw(tokens), pinned=pin)
        elif item in ("tool", "tool2"):
            call = f"call_{n}"
            name = draw(st.sampled_from(["", "read_file", "bash"]))
            b.add(TOOL_CALL, draw(tokens), call=call, name=name)
            results = 2 if item == "tool2" else 1
            for _ in range(results):
                b.add(
                    TOOL_RESULT,
                    words_ + 3 + 1 + (1 if name else 0),
                    pinned=pin,
                    call=call,
                    name=name,
                    content=content,
                )
        elif item == "orphan":
            b.add(TOOL_RESULT, words_ + 4, call=f"gone_{n}", content=content, pinned=pin)
        else:
            b.add(TOOL_CALL, draw(tokens), call=f"pending_{n}", pinned=pin)
    return b.events


@st.composite
def budgets(draw: st.DrawFn) -> Budget:
    limit = draw(st.integers(min_value=50, max_value=20_000))
    return Budget(
        context_limit=limit,
        target_tokens=draw(st.integers(min_value=0, max_value=limit)),
        max_summary_tokens=draw(st.integers(min_value=0, max_value=600)),
        keep_recent_events=draw(st.integers(min_value=0, max_value=5)),
        keep_recent_tool_results=draw(st.integers(min_value=0, max_value=4)),
    )


def groups(events: Sequence[PlanEvent]) -> list[list[PlanEvent]]:
    """Fold units, recomputed independently: tool calls with their results, else singletons."""
    calls = {e.tool_call_id for e in events if e.type == TOOL_CALL and e.tool_call_id}
    keyed: dict[str, list[PlanEvent]] = {}
    order: list[list[PlanEvent]] = []
    for e in events:
        if e.type in (TOOL_CALL, TOOL_RESULT) and e.tool_call_id in calls:
            if e.tool_call_id not in keyed:
                keyed[e.tool_call_id] = []
                order.append(keyed[e.tool_call_id])
            keyed[e.tool_call_id].append(e)
        else:
            order.append([e])
    return order


def latest_user(events: Sequence[PlanEvent]) -> str | None:
    users = [e.id for e in events if e.type == USER_MESSAGE]
    return users[-1] if users else None


def locked(group: list[PlanEvent], events: Sequence[PlanEvent]) -> bool:
    last = latest_user(events)
    return any(e.pinned or e.type == SYSTEM_PROMPT or e.id == last for e in group)


def check_common(plan: Plan, events: Sequence[PlanEvent]) -> None:
    ids = [e.id for e in events]
    folded = set(plan.fold_ids)
    assert len(folded) == len(plan.fold_ids)
    assert folded <= set(ids)
    assert list(plan.fold_ids) == [i for i in ids if i in folded]
    for e in events:
        if e.id in folded:
            assert e.type != SYSTEM_PROMPT
            assert not e.pinned
            assert e.id != latest_user(events)
    for group in groups(events):
        states = {e.id in folded for e in group}
        assert len(states) == 1, f"tool group split: {[e.id for e in group]}"
    assert plan.tokens_before == cost(events)
    assert plan.events_before == len(events)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(events=sessions(), budget=budgets())
def test_it_trim_keeps_every_invariant(events: list[PlanEvent], budget: Budget) -> None:
    plan = plan_compaction(strategy="trim", events=events, budget=budget)
    check_common(plan, events)
    folded = set(plan.fold_ids)
    kept = [e for e in events if e.id not in folded]
    assert not plan.needs_summary and not plan.cleared
    assert plan.tokens_after == cost(kept)
    assert plan.events_after == len(kept)
    if plan.tokens_before <= budget.target_tokens:
        assert plan.is_empty
        return
    units = groups(events)
    floor = cost([e for g in units if locked(g, events) for e in g])
    if floor <= budget.target_tokens:
        assert plan.tokens_after <= budget.target_tokens
        assert not plan.notes
    else:
        assert plan.tokens_after == floor
        assert plan.notes
    # Oldest first and no more than needed: the folded units are a prefix of the foldable
    # ones, and the context was still over target before the last of them was folded.
    foldable = [g for g in units if not locked(g, events)]
    folded_units = [g for g in foldable if g[0].id in folded]
    assert folded_units == foldable[: len(folded_units)]
    if folded_units:
        last = sum(e.token_count for e in folded_units[-1])
        assert primer(plan.tokens_after - (3 if kept else 0) + last, 1) > budget.target_tokens


def recent_agent_units(events: Sequence[PlanEvent], keep: int) -> list[list[PlanEvent]]:
    agent = [
        g
        for g in groups(events)
        if not locked(g, events)
        and not {e.type for e in g} & {USER_MESSAGE, CONTEXT_REFRESH, COMPACTION}
    ]
    recent: list[list[PlanEvent]] = []
    count = 0
    for g in reversed(agent):
        if count >= keep:
            break
        recent.append(g)
        count += len(g)
    return recent


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(events=sessions(), budget=budgets())
def test_it_summarize_keeps_every_invariant(events: list[PlanEvent], budget: Budget) -> None:
    plan = plan_compaction(strategy="summarize", events=events, budget=budget)
    check_common(plan, events)
    folded = set(plan.fold_ids)
    kept = [e for e in events if e.id not in folded]
    reserve = budget.max_summary_tokens + SUMMARY_MESSAGE_OVERHEAD
    if plan.is_empty:
        assert not plan.needs_summary
        assert plan.tokens_after == plan.tokens_before
        return
    assert plan.needs_summary
    assert plan.summary_reserve_tokens == reserve
    assert plan.tokens_after == sum(e.token_count for e in kept) + reserve + 3
    assert plan.events_after == len(kept) + 1
    # The new summary supersedes the old one.
    for e in events:
        if e.type == COMPACTION and not e.pinned:
            assert e.id in folded
    floor = sum(e.token_count for g in groups(events) if locked(g, events) for e in g)
    if floor + reserve + 3 <= budget.context_limit:
        assert plan.tokens_after <= budget.context_limit
    user_folded = [
        e for e in events if e.id in folded and e.type in (USER_MESSAGE, CONTEXT_REFRESH)
    ]
    recent = recent_agent_units(events, budget.keep_recent_events)
    recent_ids = {e.id for g in recent for e in g}
    if user_folded or recent_ids & folded:
        # Only when the ordinary plan (all users and recent agent work kept) would overflow.
        ordinary = [
            e
            for e in events
            if e.type in (USER_MESSAGE, CONTEXT_REFRESH, SYSTEM_PROMPT)
            or e.id in recent_ids
            or any(e in g for g in groups(events) if locked(g, events))
        ]
        assert sum(e.token_count for e in ordinary) + reserve + 3 > budget.context_limit
        assert plan.notes
    else:
        assert recent_ids <= {e.id for e in kept}
        for e in events:
            if e.type in (USER_MESSAGE, CONTEXT_REFRESH):
                assert e.id not in folded


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(events=sessions(), budget=budgets())
def test_it_clear_tool_results_keeps_every_invariant(
    events: list[PlanEvent], budget: Budget
) -> None:
    plan = plan_compaction(
        strategy="clear_tool_results", events=events, budget=budget, count_tokens=words
    )
    check_common(plan, events)
    assert not plan.fold_ids and not plan.needs_summary
    results = [e for e in events if e.type == TOOL_RESULT]
    keep = budget.keep_recent_tool_results
    older = results[: len(results) - keep] if keep else results
    by_id = {e.id: e for e in events}
    cleared = {c.event_id: c for c in plan.cleared}
    assert set(cleared) <= {e.id for e in older if not e.pinned}
    for c in plan.cleared:
        event = by_id[c.event_id]
        assert c.placeholder.startswith("[tool result cleared: ")
        assert (event.name or "tool") in c.placeholder
        expected = (
            3 + words("tool") + words(c.placeholder) + (words(event.name) if event.name else 0)
        )
        assert c.token_count == expected
        assert c.tokens_freed == event.token_count - c.token_count > 0
        assert f"{c.tokens_freed} tokens freed" in c.placeholder
    saving = []
    for e in older:
        if e.pinned or e.id in cleared or e.content.startswith("[tool result cleared:"):
            continue
        text = tool_placeholder(name=e.name, tokens_freed=1)
        if 3 + 1 + words(text) + (1 if e.name else 0) < e.token_count:
            saving.append(e)
    # Skipped because a placeholder would not save anything, or kept whole in the room below
    # the target: then they are the newest of the outputs it could clear.
    if saving:
        newest_cleared = max((by_id[c].seq for c in cleared), default=0)
        assert all(e.seq > newest_cleared for e in saving)
        assert plan.tokens_after <= budget.target_tokens
    assert plan.tokens_after == plan.tokens_before - sum(c.tokens_freed for c in plan.cleared)
    assert plan.events_after == len(events)


# --- examples --------------------------------------------------------------------------------


def budget(**overrides: int) -> Budget:
    values = {"context_limit": 1000, "target_tokens": 800}
    values.update(overrides)
    return Budget(**values)


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_it_plans_nothing_for_an_empty_session(strategy: str) -> None:
    plan = plan_compaction(strategy=strategy, events=[], budget=budget(), count_tokens=words)
    assert plan.is_empty
    assert (plan.tokens_before, plan.tokens_after, plan.events_before, plan.events_after) == (
        0,
        0,
        0,
        0,
    )


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_it_plans_nothing_for_a_tiny_session(strategy: str) -> None:
    b = Builder()
    b.add(SYSTEM_PROMPT, 900)
    b.add(USER_MESSAGE, 200)
    plan = plan_compaction(
        strategy=strategy, events=b.events, budget=budget(target_tokens=10), count_tokens=words
    )
    assert plan.is_empty
    assert plan.tokens_after == plan.tokens_before == 1103


def test_it_lists_its_strategies_and_rejects_unknown_names() -> None:
    assert strategy_names() == ["clear_tool_results", "summarize", "trim"]
    with pytest.raises(KeyError):
        plan_compaction(strategy="nope", events=[], budget=budget())


def test_it_requires_a_counter_for_clear_tool_results() -> None:
    with pytest.raises(ValueError):
        plan_compaction(strategy="clear_tool_results", events=[], budget=budget())


def test_it_trims_to_the_target_exactly() -> None:
    b = Builder()
    b.add(SYSTEM_PROMPT, 100)
    b.add(USER_MESSAGE, 50)  # e2
    b.add(AGENT_MESSAGE, 200)  # e3
    b.add(USER_MESSAGE, 50)  # e4
    b.add(AGENT_MESSAGE, 97)  # e5
    b.add(USER_MESSAGE, 10)  # e6
    # 507 + 3 = 510; folding e2 and e3 leaves exactly 260.
    plan = plan_compaction(strategy="trim", events=b.events, budget=budget(target_tokens=260))
    assert plan.fold_ids == ("e2", "e3")
    assert plan.tokens_after == 260
    assert plan.events_after == 4
    assert not plan.notes


def test_it_trims_an_over_limit_session_and_folds_the_old_summary() -> None:
    b = Builder()
    b.add(SYSTEM_PROMPT, 100)
    b.add(COMPACTION, 300)
    b.add(USER_MESSAGE, 400)
    b.add(TOOL_CALL, 20, call="c1")
    b.add(AGENT_MESSAGE, 500)
    b.add(TOOL_RESULT, 600, call="c1")
    b.add(USER_MESSAGE, 40)
    plan = plan_compaction(
        strategy="trim", events=b.events, budget=budget(context_limit=1000, target_tokens=800)
    )
    assert plan.tokens_before == 1963
    # The summary and the first user turn go, then the tool call with its (later) result;
    # the agent message between them is newer than the group's first event and survives.
    assert plan.fold_ids == ("e2", "e3", "e4", "e6")
    assert plan.tokens_after == 100 + 500 + 40 + 3


def test_it_notes_an_unreachable_trim_and_folds_everything_foldable() -> None:
    b = Builder()
    b.add(SYSTEM_PROMPT, 900)
    b.add(AGENT_MESSAGE, 100, pinned=True)
    b.add(AGENT_MESSAGE, 100)
    b.add(USER_MESSAGE, 100)
    plan = plan_compaction(strategy="trim", events=b.events, budget=budget(target_tokens=500))
    assert plan.fold_ids == ("e3",)
    assert plan.tokens_after == 1103
    assert plan.notes and "unreachable" in plan.notes[0]


def test_it_never_separates_a_pinned_tool_result_from_its_call() -> None:
    b = Builder()
    b.add(USER_MESSAGE, 10)
    b.add(TOOL_CALL, 10, call="c1")
    b.add(TOOL_RESULT, 500, call="c1", pinned=True)
    b.add(AGENT_MESSAGE, 500)
    b.add(USER_MESSAGE, 10)
    plan = plan_compaction(strategy="trim", events=b.events, budget=budget(target_tokens=100))
    assert plan.fold_ids == ("e1", "e4")


def test_it_summarizes_incrementally_folding_the_previous_summary() -> None:
    b = Builder()
    b.add(SYSTEM_PROMPT, 100)
    b.add(COMPACTION, 250)
    b.add(USER_MESSAGE, 30)
    b.add(TOOL_CALL, 20, call="c1")
    b.add(TOOL_RESULT, 2000, call="c1")
    b.add(AGENT_MESSAGE, 60)
    b.add(USER_MESSAGE, 30)
    b.add(TOOL_CALL, 20, call="c2")
    b.add(TOOL_RESULT, 900, call="c2")
    b.add(AGENT_MESSAGE, 70)
    plan = plan_compaction(
        strategy="summarize",
        events=b.events,
        budget=budget(context_limit=10_000, keep_recent_events=2, max_summary_tokens=256),
    )
    # The newest foldable unit is the agent message (1 event), then the c2 group (2 events):
    # keeping "at least 2 events" keeps both, whole.
    assert plan.fold_ids == ("e2", "e4", "e5", "e6")
    assert plan.needs_summary
    assert plan.summary_reserve_tokens == 256 + SUMMARY_MESSAGE_OVERHEAD
    assert plan.tokens_after == 100 + 30 + 30 + 20 + 900 + 70 + 264 + 3
    assert plan.events_after == 7


def test_it_does_not_summarize_when_only_recent_work_remains() -> None:
    b = Builder()
    b.add(SYSTEM_PROMPT, 100)
    b.add(COMPACTION, 250)
    b.add(USER_MESSAGE, 30)
    b.add(AGENT_MESSAGE, 60)
    plan = plan_compaction(strategy="summarize", events=b.events, budget=budget())
    assert plan.is_empty and not plan.needs_summary


def test_it_folds_the_oldest_user_messages_when_they_do_not_fit() -> None:
    b = Builder()
    b.add(SYSTEM_PROMPT, 100)
    for _ in range(5):
        b.add(USER_MESSAGE, 200)  # e2..e6
        b.add(AGENT_MESSAGE, 50)  # e3..e11 odd
    b.add(USER_MESSAGE, 100)  # e12
    b.add(AGENT_MESSAGE, 10)  # e13
    plan = plan_compaction(
        strategy="summarize",
        events=b.events,
        budget=budget(context_limit=900, keep_recent_events=1, max_summary_tokens=100),
    )
    # Kept after folding agent work: 100 + 5*200 + 100 + 10 = 1210, + 108 + 3 is over 900;
    # the two oldest user messages go: 810 + 111 = 921 still over, so a third: 721.
    folded = set(plan.fold_ids)
    assert {"e2", "e4", "e6"} <= folded
    assert not {"e8", "e10", "e12", "e13"} & folded
    assert plan.tokens_after == 100 + 200 + 200 + 100 + 10 + 108 + 3
    assert plan.tokens_after <= 900
    assert any("user message" in note for note in plan.notes)


def test_it_folds_recent_work_when_even_the_latest_turns_do_not_fit() -> None:
    b = Builder()
    b.add(SYSTEM_PROMPT, 100)
    b.add(USER_MESSAGE, 100)
    b.add(TOOL_CALL, 10, call="c1")
    b.add(TOOL_RESULT, 5000, call="c1")
    plan = plan_compaction(
        strategy="summarize",
        events=b.events,
        budget=budget(context_limit=1000, keep_recent_events=2, max_summary_tokens=100),
    )
    assert plan.fold_ids == ("e3", "e4")
    assert plan.tokens_after == 100 + 100 + 108 + 3


def test_it_clears_old_tool_results_with_an_exact_placeholder_cost() -> None:
    b = Builder()
    b.add(USER_MESSAGE, 10)
    for n in range(4):
        b.add(TOOL_CALL, 10, call=f"c{n}", name="grep")
        b.add(TOOL_RESULT, 1234 + n, call=f"c{n}", name="grep")
    b.add(TOOL_CALL, 10, call="tiny")
    b.add(TOOL_RESULT, 9, call="tiny")
    plan = plan_compaction(
        strategy="clear_tool_results",
        events=b.events,
        budget=budget(keep_recent_tool_results=2),
        count_tokens=words,
    )
    assert [c.event_id for c in plan.cleared] == ["e3", "e5", "e7"]
    first = plan.cleared[0]
    # "[tool result cleared: grep output [#3], N tokens freed]" is 9 words; 3 + 1 + 9 + 1 = 14.
    # The seq is cited as a summary cites one: `ledger_recall` fetches the output by it.
    assert first.token_count == 14
    assert first.tokens_freed == 1220
    assert first.placeholder == "[tool result cleared: grep output [#3], 1220 tokens freed]"
    assert plan.tokens_after == plan.tokens_before - (1220 + 1221 + 1222)


def test_it_prices_placeholders_exactly_with_a_real_tokenizer() -> None:
    tokens = pytest.importorskip("sessions_app.tokens")
    counter = tokens.get_counter("o200k_base")
    b = Builder()
    b.add(USER_MESSAGE, 10)
    b.add(TOOL_CALL, 10, call="c1", name="read_file")
    b.add(TOOL_RESULT, 4321, call="c1", name="read_file")
    plan = plan_compaction(
        strategy="clear_tool_results",
        events=b.events,
        budget=budget(keep_recent_tool_results=0),
        count_tokens=counter.count,
    )
    (c,) = plan.cleared
    expected = tokens.message_tokens(counter, role="tool", content=c.placeholder, name="read_file")
    assert c.token_count == expected
    assert c.tokens_freed == 4321 - expected


def test_it_does_not_clear_a_result_twice() -> None:
    b = Builder()
    b.add(USER_MESSAGE, 10)
    b.add(TOOL_CALL, 10, call="c1", name="grep")
    b.add(
        TOOL_RESULT,
        20,  # a different tokenizer priced it higher; re-clearing would "save" 7
        call="c1",
        name="grep",
        content="[tool result cleared: grep output, 99999 tokens freed]",
    )
    plan = plan_compaction(
        strategy="clear_tool_results",
        events=b.events,
        budget=budget(keep_recent_tool_results=0),
        count_tokens=words,
    )
    assert plan.is_empty


def _priced(events: list[dict], counter) -> list[PlanEvent]:  # type: ignore[no-untyped-def]
    """REST-shaped events as a strategy sees them, each priced exactly as the ledger stores it."""
    from sessions_app import tokens

    roles = {TOOL_RESULT: "tool", TOOL_CALL: "assistant", SYSTEM_PROMPT: "system"}
    return [
        PlanEvent(
            id=f"e{n}",
            seq=n,
            type=event["type"],
            token_count=tokens.message_tokens(
                counter,
                role=roles.get(event["type"], "user"),
                content=event["content"],
                name=event.get("name", ""),
            ),
            tool_call_id=event.get("toolCallId", ""),
            name=event.get("name", ""),
            content=event["content"],
        )
        for n, event in enumerate(events, start=1)
    ]


def test_it_keeps_the_salient_lines_of_a_cleared_output_in_its_placeholder() -> None:
    tokens = pytest.importorskip("sessions_app.tokens")
    from compaction_app.strategies import (
        CLEARED_PREFIX,
        KEPT_MAX_SHARE,
        KEPT_MAX_TOKENS,
        KEPT_POINTED_TOKENS,
    )
    from compaction_app.testkit.tool_output_session import buried_session, facts_kept, load_corpus

    counter = tokens.get_counter("o200k_base")
    corpus = {fixture.name: fixture for fixture in load_corpus()}
    fixtures = [corpus[n] for n in ("kubectl_describe_pod", "tsc_errors", "pytest_failure")]
    events = _priced(buried_session(fixtures, routine=60), counter)

    def plan() -> Plan:
        return plan_compaction(
            strategy="clear_tool_results",
            events=events,
            budget=budget(keep_recent_tool_results=2),
            count_tokens=counter.count,
        )

    first = plan()
    cleared = {c.event_id: c for c in first.cleared}
    for fixture in fixtures:
        (event,) = [e for e in events if e.content == fixture.text]
        (call,) = [
            e for e in events if e.type == TOOL_CALL and e.tool_call_id == event.tool_call_id
        ]
        c = cleared[event.id]
        # Cleared (other code finds it by the prefix), yet the output's facts stay in view:
        # its verdicts in the placeholder, what it was run on in the call beside it.
        assert c.placeholder.startswith(
            f"{CLEARED_PREFIX} bash output [#{event.seq}], {c.tokens_freed} tokens"
        )
        seen = f"{call.content}\n{c.placeholder}"
        assert facts_kept(seen, fixture.facts) == list(fixture.facts), fixture.name
        # Priced exactly, as the ledger will store it.
        assert c.token_count == tokens.message_tokens(
            counter, role="tool", content=c.placeholder, name="bash"
        )
        assert c.tokens_freed == event.token_count - c.token_count > 0
        # Bounded: the kept lines cost at most half the output and at most what the records
        # the conversation points at take, within 160 … KEPT_POINTED_TOKENS.
        kept = c.placeholder[c.placeholder.index("\n") :]
        room = min(
            int(event.token_count * KEPT_MAX_SHARE), max(KEPT_MAX_TOKENS, KEPT_POINTED_TOKENS)
        )
        assert 0 < counter.count(kept) <= room
    assert first.tokens_after == first.tokens_before - sum(c.tokens_freed for c in first.cleared)
    # Deterministic: the same events give the same placeholders, byte for byte.
    assert plan().cleared == first.cleared


def test_it_clears_to_the_bare_placeholder_when_kept_lines_would_free_nothing() -> None:
    b = Builder()
    b.add(USER_MESSAGE, 10)
    b.add(TOOL_CALL, 10, call="c1", name="grep")
    line = "error: build failed at step 7 in module_x"  # 8 words: salient, a failure
    b.add(TOOL_RESULT, 23, call="c1", name="grep", content=line)
    (c,) = plan_compaction(
        strategy="clear_tool_results",
        events=b.events,
        # No room below the target: the output cannot stay whole.
        budget=budget(keep_recent_tool_results=0, target_tokens=0),
        count_tokens=words,
    ).cleared
    # With its line the placeholder would cost 3 + 1 + (11 + 8) + 1 = 24 words: nothing freed.
    assert c.placeholder == "[tool result cleared: grep output [#3], 9 tokens freed]"
    assert (c.token_count, c.tokens_freed) == (14, 9)


def _build_log(step: int, *, failure: str = "") -> str:
    """A build's output: routine INFO lines, the routine deprecation warning every build
    prints, and, when given, the one failure of this build."""
    lines = [f"INFO [{step:03d}] compiling module_{k} ok ({k * 7 + step} ms)" for k in range(12)]
    lines.append("WARNING: option --legacy-resolver is deprecated")
    if failure:
        lines.insert(6, failure)
    lines.append(f"INFO [{step:03d}] build finished")
    return "\n".join(lines)


def _builds(failing_step: int, failure: str) -> list[PlanEvent]:
    b = Builder()
    b.add(USER_MESSAGE, 12, content="Keep building the service until it stops breaking.")
    for step in range(8):
        log = _build_log(step, failure=failure if step == failing_step else "")
        b.add(TOOL_CALL, 8, call=f"c{step}", name="bash", content='{"command": "make build"}')
        b.add(TOOL_RESULT, words(log), call=f"c{step}", name="bash", content=log)
        # The agent moves on without naming anything the output said.
        b.add(AGENT_MESSAGE, 4, content="Carrying on with the next step.")
    return b.events


def test_it_keeps_an_outputs_own_failure_in_its_placeholder_though_nothing_names_it() -> None:
    failure = "ERROR ledger_sink: checksum 9f3ab2 does not match manifest 77c01e"
    events = _builds(2, failure)
    plan = plan_compaction(
        strategy="clear_tool_results",
        events=events,
        budget=budget(context_limit=10_000, target_tokens=0, keep_recent_tool_results=0),
        count_tokens=words,
    )
    by_id = {e.id: e for e in events}
    placeholders = {by_id[c.event_id].seq: c.placeholder for c in plan.cleared}
    (failing,) = [e for e in events if failure in e.content]
    # The verdict of that build is in its placeholder, cited by its seq ...
    assert failure in placeholders[failing.seq]
    assert f"[#{failing.seq}]" in placeholders[failing.seq]
    # ... and the warning every build prints is the routine's, kept in none.
    assert len(placeholders) == 8
    assert not any("deprecated" in text for text in placeholders.values())


def test_it_leaves_an_output_that_is_mostly_its_verdict_whole() -> None:
    b = Builder()
    b.add(USER_MESSAGE, 8, content="Why does the type check fail?")
    b.add(TOOL_CALL, 6, call="c1", name="bash", content='{"command": "tsc --noEmit"}')
    errors = "\n".join(
        [
            "src/cart.ts(48,17): error TS2345: Argument of type 'string | undefined'",
            "src/cart.ts(71,9): error TS2532: Object is possibly 'undefined'.",
            "Found 2 errors in 1 file.",
        ]
    )
    b.add(TOOL_RESULT, words(errors), call="c1", name="bash", content=errors)
    b.add(TOOL_CALL, 6, call="c2", name="bash", content='{"command": "ls src"}')
    listing = "\n".join(f"module_{k}.ts" for k in range(30))
    b.add(TOOL_RESULT, words(listing), call="c2", name="bash", content=listing)
    b.add(USER_MESSAGE, 4, content="Fix the first one.")
    plan = plan_compaction(
        strategy="clear_tool_results",
        events=b.events,
        budget=budget(target_tokens=0, keep_recent_tool_results=0),
        count_tokens=words,
    )
    # Its placeholder would keep every line (or drop one of the two errors): it stays as it
    # was; the listing nobody looked at is cleared.
    assert [c.event_id for c in plan.cleared] == [b.events[4].id]


def test_it_keeps_what_a_cleared_diff_added_in_its_placeholder() -> None:
    b = Builder()
    b.add(USER_MESSAGE, 8, content="Show me the change before we commit it.")
    b.add(TOOL_CALL, 6, call="c1", name="bash", content='{"command": "git diff"}')
    diff = "\n".join(
        [
            "diff --git a/src/core.py b/src/core.py",
            "--- a/src/core.py",
            "+++ b/src/core.py",
            "@@ -10,6 +10,7 @@ class Job:",
            *[f"     line_{k} = compute_{k}(value)" for k in range(40)],
            "-    local = after.astimezone(self.tz)",
            "+    instant = after.astimezone(UTC).replace(second=0)",
        ]
    )
    b.add(TOOL_RESULT, words(diff), call="c1", name="bash", content=diff)
    b.add(USER_MESSAGE, 4, content="Commit it.")
    (c,) = plan_compaction(
        strategy="clear_tool_results",
        events=b.events,
        budget=budget(target_tokens=0, keep_recent_tool_results=0),
        count_tokens=words,
    ).cleared
    # What the change made is the diff's verdict; the context lines around it are not.
    assert "+ instant = after.astimezone(UTC).replace(second=0)" in c.placeholder
    assert "line_3" not in c.placeholder
