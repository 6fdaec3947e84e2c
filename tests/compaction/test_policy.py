"""The compaction policy (compaction_app/policy.py): the summary's bound, the trigger, the target
and the room rule, as the summarize and clear_tool_results strategies apply it. Pure: no
database."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from compaction_app.policy import RECENT_SHARE, Policy, summary_bound
from compaction_app.strategies import SUMMARY_MESSAGE_OVERHEAD, plan_compaction
from compaction_app.types import AGENT_MESSAGE, SYSTEM_PROMPT, TOOL_CALL, TOOL_RESULT, USER_MESSAGE
from tests.compaction.test_strategies import Builder, words

pytestmark = pytest.mark.profile_independent

NOW = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)


def agent_session(turns: int, *, output: int = 400, text: int = 20) -> Builder:
    """A system prompt, one request, then `turns` agent turns: words, a call, its output."""
    b = Builder()
    b.add(SYSTEM_PROMPT, 50)
    b.add(USER_MESSAGE, 40)
    for turn in range(turns):
        b.add(AGENT_MESSAGE, text)
        b.add(TOOL_CALL, 15, call=f"c{turn}", name="bash")
        b.add(TOOL_RESULT, output, call=f"c{turn}", name="bash")
    b.add(USER_MESSAGE, 30)
    return b


# --- the summary's bound -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("limit", "setting", "expected"),
    [
        (1_000_000, None, 16_384),
        (128_000, None, 6_400),
        (200_000, 8_192, 8_192),
        (2_000, None, 256),
    ],
)
def test_it_bounds_the_summary_by_the_window_or_the_users_number(limit, setting, expected):
    assert summary_bound(context_limit=limit, max_summary_tokens=setting) == expected
    budget = Policy(max_summary_tokens=setting).budget(context_limit=limit)
    assert budget.max_summary_tokens == expected


@pytest.mark.parametrize(
    ("call_path", "limit", "bound"), [(False, 1_000_000, 16_384), (True, 40_000, 2_048)]
)
def test_it_never_grows_the_summary_into_the_room(call_path, limit, bound):
    """However much room the target leaves, the summary keeps its bound (the room goes to
    recent turns)."""
    b = agent_session(60)
    budget = Policy().budget(
        context_limit=limit, target_ratio=0.5 if call_path else None, call_path=call_path
    )
    plan = plan_compaction(strategy="summarize", events=b.events, budget=budget)
    assert plan.needs_summary
    assert plan.summary_reserve_tokens == bound + SUMMARY_MESSAGE_OVERHEAD


# --- the room rule ---------------------------------------------------------------------------


def kept_turns(plan, b: Builder) -> list[int]:
    """The indices of the agent turns a plan keeps (their three events all kept)."""
    folded = set(plan.fold_ids)
    agent = [e for e in b.events if e.type == AGENT_MESSAGE]
    kept = []
    for index, message in enumerate(agent):
        turn = b.events[message.seq - 1 : message.seq + 2]
        if not any(e.id in folded for e in turn):
            kept.append(index)
        else:
            assert all(e.id in folded for e in turn), "a turn is kept or folded whole"
    return kept


def test_it_fills_the_room_below_the_target_with_the_newest_whole_turns_in_the_call_path():
    # 60 turns of 435 tokens in a 40,000-token window: the target (0.5) is 20,000 tokens.
    b = agent_session(60)
    budget = Policy(keep_recent_events=2).budget(
        context_limit=40_000, target_ratio=0.5, call_path=True
    )
    plan = plan_compaction(strategy="summarize", events=b.events, budget=budget)
    kept = kept_turns(plan, b)
    # Newest first and contiguous, as many as fit: well past keepRecentEvents.
    assert kept == list(range(60 - len(kept), 60))
    assert len(kept) > 20
    assert plan.tokens_after <= budget.target_tokens
    # One more turn would not have fit the target.
    assert plan.tokens_after + 435 > budget.target_tokens


def test_it_gives_recent_work_a_share_of_what_it_folds_outside_the_call_path():
    b = agent_session(60)
    budget = Policy().budget(context_limit=1_000_000)
    plan = plan_compaction(strategy="summarize", events=b.events, budget=budget)
    kept = kept_turns(plan, b)
    work = 60 * 435
    assert kept == list(range(60 - len(kept), 60))
    assert len(kept) * 435 <= RECENT_SHARE * work + 435  # keepRecentEvents rounds up a turn
    assert len(kept) >= 10


def test_it_leaves_at_most_two_fifths_of_a_long_session_where_agent_work_dominates():
    """A REST summarize of a long session (1M window, auto budget): the summary is bounded and
    recent work takes a share, so the context after is at most 40 % of before."""
    b = agent_session(1_000, output=500)
    budget = Policy().budget(context_limit=1_000_000)
    plan = plan_compaction(strategy="summarize", events=b.events, budget=budget)
    assert plan.tokens_after <= 0.4 * plan.tokens_before


def test_it_keeps_newest_outputs_whole_before_growing_placeholders():
    b = agent_session(30, output=400)
    budget = Policy().budget(context_limit=40_000, target_ratio=0.5, call_path=True)
    plan = plan_compaction(
        strategy="clear_tool_results", events=b.events, budget=budget, count_tokens=words
    )
    cleared = {c.event_id for c in plan.cleared}
    results = [e for e in b.events if e.type == TOOL_RESULT]
    whole = [e for e in results if e.id not in cleared]
    # The uncleared outputs are the newest ones, contiguous, more than the three kept anyway.
    assert whole == results[-len(whole) :]
    assert len(whole) > 3
    assert plan.tokens_after <= budget.target_tokens


# --- the trigger -----------------------------------------------------------------------------


def test_it_triggers_once_per_cooldown_and_at_the_hard_limit_within_it():
    policy = Policy(cooldown_seconds=60)
    below = policy.level(tokens=790, window=1000)
    near = policy.level(tokens=800, window=1000)
    hard = policy.level(tokens=950, window=1000)
    assert (
        policy.auto_trigger(level=below, last_auto_at=None, auto_active=False, now=NOW).trigger
        is None
    )
    assert (
        policy.auto_trigger(level=near, last_auto_at=None, auto_active=False, now=NOW).trigger
        == "auto"
    )
    recent = NOW - timedelta(seconds=30)
    assert (
        policy.auto_trigger(level=near, last_auto_at=recent, auto_active=False, now=NOW).trigger
        is None
    )
    late = NOW - timedelta(seconds=61)
    assert (
        policy.auto_trigger(level=near, last_auto_at=late, auto_active=False, now=NOW).trigger
        == "auto"
    )
    decision = policy.auto_trigger(level=hard, last_auto_at=recent, auto_active=False, now=NOW)
    assert (decision.trigger, decision.needs_plan) == ("hard_limit", True)
    assert (
        policy.auto_trigger(level=near, last_auto_at=None, auto_active=True, now=NOW).trigger
        is None
    )
    off = Policy(auto_compact=False)
    assert (
        off.auto_trigger(level=hard, last_auto_at=None, auto_active=False, now=NOW).trigger is None
    )


def test_it_aims_at_fit_target_ratio_never_above_the_compact_threshold():
    assert Policy().target_ratio == 0.5
    assert Policy(compact_threshold=0.4, fit_target_ratio=0.5).target_ratio == 0.4
    assert Policy().target_tokens(128_000) == 64_000
    # Fitting to a client's smaller cap aims at that cap's target, as a share of the limit.
    assert Policy().call_path_ratio(window=64_000, context_limit=128_000) == 0.25
