"""Pure unit tests of sessions_app.context_window (no database, no settings)."""

from __future__ import annotations

import pytest

from sessions_app.context_window import (
    REPLY_PRIMER,
    WindowItem,
    context_cost,
    effective_limit,
    prune,
    required_keys,
    window_level,
)

pytestmark = pytest.mark.profile_independent


def item(key, kind="AGENT_MESSAGE", cost=10, call=""):
    return WindowItem(key=key, type=kind, cost=cost, tool_call_id=call)


def test_it_adds_the_reply_primer_only_when_something_is_sent():
    assert context_cost([]) == 0
    assert context_cost([5]) == 5 + REPLY_PRIMER
    assert context_cost([5, 7]) == 12 + REPLY_PRIMER


@pytest.mark.parametrize(
    ("context_limit", "max_tokens", "reserve", "expected"),
    [
        (1000, None, 0, 1000),
        (1000, 400, 0, 400),
        (1000, 4000, 0, 1000),
        (1000, 400, 100, 300),
        (1000, None, 2000, 0),
    ],
)
def test_it_computes_the_effective_limit(context_limit, max_tokens, reserve, expected):
    assert (
        effective_limit(context_limit=context_limit, max_tokens=max_tokens, reserve_tokens=reserve)
        == expected
    )


@pytest.mark.parametrize(
    ("tokens", "limit", "level"),
    [
        (0, 100, "ok"),
        (79, 100, "ok"),
        (80, 100, "approaching"),
        (94, 100, "approaching"),
        (95, 100, "hard"),
        (500, 100, "hard"),
        (0, 0, "hard"),
    ],
)
def test_it_grades_the_window(tokens, limit, level):
    assert (
        window_level(tokens=tokens, limit=limit, compact_threshold=0.8, hard_threshold=0.95)
        == level
    )


def test_it_requires_system_summary_and_the_last_user_message():
    items = [
        item("s", "SYSTEM_PROMPT"),
        item("sum", "COMPACTION"),
        item("u1", "USER_MESSAGE"),
        item("a1"),
        item("u2", "USER_MESSAGE"),
        item("a2"),
    ]
    assert required_keys(items) == ["s", "sum", "u2"]


def test_it_counts_a_context_refresh_as_a_user_turn():
    items = [item("u", "USER_MESSAGE"), item("r", "CONTEXT_REFRESH"), item("a")]
    assert required_keys(items) == ["r"]


def test_it_keeps_everything_that_fits():
    items = [item("s", "SYSTEM_PROMPT"), item("u", "USER_MESSAGE"), item("a")]
    assert prune(items, budget=1000) == ["s", "u", "a"]


def test_it_drops_the_oldest_first():
    items = (
        [item("s", "SYSTEM_PROMPT", 10)]
        + [item(f"m{i}", cost=10) for i in range(5)]
        + [item("u", "USER_MESSAGE", 10)]
    )
    # System + user + primer = 23; room for two more 10-token messages within 45.
    assert prune(items, budget=45) == ["s", "m3", "m4", "u"]


def test_it_keeps_a_contiguous_newest_tail():
    items = [
        item("s", "SYSTEM_PROMPT", 5),
        item("small_old", cost=1),
        item("big", cost=50),
        item("new", cost=5),
        item("u", "USER_MESSAGE", 5),
    ]
    # "small_old" would fit by itself, but keeping it across the dropped "big" would leave a hole.
    assert prune(items, budget=30) == ["s", "new", "u"]


def test_it_never_splits_a_tool_call_from_its_result():
    items = [
        item("s", "SYSTEM_PROMPT", 5),
        item("u1", "USER_MESSAGE", 5),
        item("call", "TOOL_CALL", 10, call="c1"),
        item("result", "TOOL_RESULT", 30, call="c1"),
        item("a", cost=5),
        item("u2", "USER_MESSAGE", 5),
    ]
    # Room for the result but not for call + result: both go.
    kept = prune(items, budget=5 + 5 + 5 + 3 + 32)
    assert "call" not in kept and "result" not in kept
    assert kept == ["s", "a", "u2"]
    kept = prune(items, budget=5 + 5 + 5 + 3 + 40)
    assert kept == ["s", "call", "result", "a", "u2"]


def test_it_keeps_parallel_calls_with_their_own_results():
    items = [
        item("u", "USER_MESSAGE", 5),
        item("ca", "TOOL_CALL", 5, call="a"),
        item("cb", "TOOL_CALL", 5, call="b"),
        item("ra", "TOOL_RESULT", 20, call="a"),
        item("rb", "TOOL_RESULT", 5, call="b"),
        item("u2", "USER_MESSAGE", 5),
    ]
    kept = prune(items, budget=5 + 3 + 10 + 5)
    assert kept == ["cb", "rb", "u2"]


def test_it_returns_none_when_the_required_items_do_not_fit():
    items = [item("s", "SYSTEM_PROMPT", 50), item("a", cost=1), item("u", "USER_MESSAGE", 50)]
    assert prune(items, budget=102) is None
    assert prune(items, budget=103) == ["s", "u"]


def test_it_handles_no_user_message_and_no_items():
    assert prune([], budget=10) == []
    items = [item("a1", cost=10), item("a2", cost=10)]
    assert prune(items, budget=13) == ["a2"]
    assert required_keys(items) == []


def test_it_keeps_within_the_budget():
    items = (
        [item("s", "SYSTEM_PROMPT", 7)]
        + [item(f"m{i}", cost=(i * 7) % 13 + 1) for i in range(40)]
        + [item("u", "USER_MESSAGE", 9)]
    )
    costs = {i.key: i.cost for i in items}
    for budget in range(20, 300, 7):
        kept = prune(items, budget=budget)
        assert kept is not None
        assert context_cost([costs[k] for k in kept]) <= budget
        assert kept[0] == "s" and kept[-1] == "u"
