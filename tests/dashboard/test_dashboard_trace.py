"""The session page's trace grouping (pure: no database, no Django)."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

import pytest

from compaction_app.dashboard.trace import CLAMP_LINES, Body, FoldGroup, build_trace

pytestmark = pytest.mark.profile_independent


@dataclass
class Ev:
    seq: int
    type: str
    content: str = "text"
    name: str = ""
    tool_call_id: str = ""
    token_count: int = 10
    compacted_by_id: str | None = None
    cleared_content: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    reverted: bool = False
    pinned: bool = False
    id: str = ""


def test_it_labels_turns_for_people():
    items = build_trace(
        [
            Ev(1, "SYSTEM_PROMPT"),
            Ev(2, "USER_MESSAGE"),
            Ev(3, "AGENT_MESSAGE"),
            Ev(4, "TOOL_CALL", name="read_file", tool_call_id="c1"),
            Ev(5, "TOOL_RESULT", name="read_file", tool_call_id="c1"),
        ]
    )
    assert [item.label for item in items] == ["System prompt", "You", "Agent", "Tool: read_file"]
    assert items[1].side == "user" and items[2].side == "other"


def test_it_puts_a_call_and_its_results_in_one_span_even_when_interleaved():
    items = build_trace(
        [
            Ev(1, "TOOL_CALL", name="a", tool_call_id="c1", token_count=5),
            Ev(2, "TOOL_CALL", name="b", tool_call_id="c2", token_count=5),
            Ev(3, "TOOL_RESULT", tool_call_id="c2", token_count=7),
            Ev(4, "TOOL_RESULT", tool_call_id="c1", token_count=9),
            Ev(5, "TOOL_RESULT", tool_call_id="nobody", content="orphan"),
        ]
    )
    assert [(item.seq, [r.seq for r in item.results]) for item in items] == [
        (1, [4]),
        (2, [3]),
        (5, []),
    ]
    assert items[0].tokens == 14 and items[2].label == "Tool result"


def test_it_keeps_folded_events_in_place_grouped_by_their_compaction():
    events = [
        Ev(1, "SYSTEM_PROMPT"),
        Ev(2, "USER_MESSAGE"),
        Ev(3, "AGENT_MESSAGE", compacted_by_id="m1"),
        Ev(4, "TOOL_CALL", tool_call_id="c", compacted_by_id="m1"),
        Ev(5, "TOOL_RESULT", tool_call_id="c", compacted_by_id="m1"),
        Ev(6, "USER_MESSAGE"),
        Ev(7, "AGENT_MESSAGE", compacted_by_id="m1"),
        Ev(8, "COMPACTION", content="summary", id="m1"),
    ]
    items = build_trace(events, marker_seqs={"m1": 8})
    kinds = ["fold" if isinstance(i, FoldGroup) else i.seq for i in items]
    assert kinds == [1, 2, "fold", 6, "fold", 8]
    first = items[2]
    assert isinstance(first, FoldGroup)
    assert (first.event_count, first.tokens, first.marker_seq) == (3, 30, 8)
    assert (first.first_seq, first.last_seq) == (3, 5)
    assert all(not entry.open for entry in first.entries)


def test_it_opens_only_the_newest_entries():
    events = [Ev(seq, "USER_MESSAGE") for seq in range(1, 11)]
    items = build_trace(events, expanded_tail=3)
    assert [item.open for item in items] == [False] * 7 + [True] * 3


def test_it_clamps_long_content_and_keeps_short_content_whole():
    short = Body.of("one\ntwo")
    assert not short.clamped and short.preview == "one\ntwo"
    long = Body.of("\n".join(f"line {n}" for n in range(50)))
    assert long.clamped and long.preview.count("\n") == CLAMP_LINES - 1 and long.lines == 50
    assert Body.of("x" * 5000).clamped


def test_it_shows_a_cleared_results_placeholder_with_the_original_beside_it():
    (entry,) = build_trace(
        [Ev(1, "TOOL_RESULT", content="big output", cleared_content="[cleared]")]
    )
    assert entry.body.text == "[cleared]" and entry.original is not None
    assert entry.original.text == "big output"


def test_it_prices_turns_with_the_given_cost_function():
    (entry,) = build_trace(
        [Ev(1, "AGENT_MESSAGE", prompt_tokens=100, completion_tokens=10)],
        cost_of=lambda e: Decimal("0.5") if e.prompt_tokens else None,
    )
    assert entry.cost == Decimal("0.5")


def test_it_names_a_trim_marker_and_a_trimmed_group():
    run = type("Run", (), {"strategy": "trim"})()
    items = build_trace(
        [Ev(1, "AGENT_MESSAGE", compacted_by_id="m"), Ev(2, "COMPACTION", content="", id="m")],
        runs_by_marker={"m": run},
    )
    assert isinstance(items[0], FoldGroup) and not items[0].summarized
    assert items[1].label == "Trim marker" and items[1].kind == "marker"


def test_it_names_the_compaction_each_folded_event_went_into():
    run = object()
    items = build_trace(
        [
            Ev(1, "USER_MESSAGE", compacted_by_id="m1"),
            Ev(2, "AGENT_MESSAGE", compacted_by_id="m1"),
            Ev(3, "COMPACTION", content="summary", id="m1"),
            Ev(4, "USER_MESSAGE"),
        ],
        runs_by_marker={"m1": run},
        marker_seqs={"m1": 3},
    )
    group = items[0]
    assert isinstance(group, FoldGroup)
    assert [(e.folded, e.folded_at, e.folded_run) for e in group.entries] == [
        (True, 3, run),
        (True, 3, run),
    ]
    kept = [item for item in items[1:]]
    assert all(not e.folded and e.folded_at is None for e in kept)
