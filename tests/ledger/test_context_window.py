"""Pure unit tests of sessions_app.context_window (no database, no settings)."""

from __future__ import annotations

import pytest

from sessions_app.context_window import (
    REPLY_PRIMER,
    WindowItem,
    context_cost,
    effective_limit,
    required_keys,
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
