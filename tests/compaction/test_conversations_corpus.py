"""The hand-written conversation corpus and its two halves: every scenario loads as a valid
agent conversation with its facts, each fact is a literal of the scenario's own messages (never
of its routine), the `tune`/`sealed` split written in `SPLIT` is the one the fixed rule gives,
and `long_session` grows a scenario to the size asked, the same way every time."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest

from compaction_app.testkit.conversations import (
    CLOSING,
    CORPUS,
    SPLITS,
    chat_messages,
    event_tokens,
    facts_kept,
    load_scenarios,
    long_session,
    parse_scenario,
    read_split,
    render_routine,
    split_rule,
)

pytestmark = pytest.mark.profile_independent

TYPES = {"SYSTEM_PROMPT", "USER_MESSAGE", "AGENT_MESSAGE", "TOOL_CALL", "TOOL_RESULT"}


def _blanks(text: str) -> str:
    return " ".join(text.split())


def test_it_loads_every_scenario_as_an_agent_conversation_with_facts() -> None:
    scenarios = load_scenarios()
    assert len(scenarios) >= 10
    assert sorted(s.name for s in scenarios) == sorted(p.stem for p in CORPUS.glob("*.conv"))
    assert len({s.domain for s in scenarios}) == len(scenarios)
    for scenario in scenarios:
        kinds = Counter(e["type"] for e in scenario.events)
        assert set(kinds) <= TYPES, scenario.name
        assert scenario.events[0]["type"] == "SYSTEM_PROMPT", scenario.name
        assert kinds["SYSTEM_PROMPT"] == 1 and kinds["USER_MESSAGE"] >= 2, scenario.name
        assert kinds["TOOL_CALL"] == kinds["TOOL_RESULT"] >= 2, scenario.name
        assert 8 <= len(scenario.facts) <= 12, scenario.name
        assert len(set(scenario.facts)) == len(scenario.facts), scenario.name
        assert scenario.routines and scenario.notes, scenario.name
        for event in scenario.events:
            if event["type"] == "TOOL_CALL":
                assert isinstance(json.loads(event["content"]), dict), scenario.name


def test_every_fact_is_a_literal_of_its_scenario_and_of_no_routine() -> None:
    for scenario in load_scenarios():
        assert facts_kept(scenario.text, scenario.facts) == list(scenario.facts), scenario.name
        # Routine never states a fact: a fact kept is the scenario's, not a lucky routine line.
        routine = _blanks(" ".join(f"{r.arguments} {r.output}" for r in scenario.routines))
        assert not [f for f in scenario.facts if _blanks(f) in routine], scenario.name


def test_each_tool_result_follows_its_call() -> None:
    for scenario in load_scenarios():
        events = list(scenario.events)
        for k, event in enumerate(events):
            if event["type"] == "TOOL_RESULT":
                call = events[k - 1]
                assert call["type"] == "TOOL_CALL", scenario.name
                assert call["toolCallId"] == event["toolCallId"], scenario.name


def test_it_writes_the_split_the_fixed_rule_gives() -> None:
    names = [s.name for s in load_scenarios()]
    written = read_split()
    assert written == split_rule(names)
    assert split_rule(list(reversed(names))) == written
    assert set(written.values()) == set(SPLITS)


def test_it_splits_the_corpus_into_two_disjoint_halves_that_cover_it() -> None:
    tune = {s.name for s in load_scenarios(split="tune")}
    sealed = {s.name for s in load_scenarios(split="sealed")}
    assert tune and sealed
    assert not tune & sealed
    assert tune | sealed == {s.name for s in load_scenarios()}
    assert abs(len(tune) - len(sealed)) <= 1


def test_it_refuses_an_unknown_split() -> None:
    with pytest.raises(ValueError, match="split must be one of"):
        load_scenarios(split="all")


def test_routine_templates_fill_deterministically() -> None:
    for scenario in load_scenarios():
        for routine in scenario.routines:
            first = render_routine(routine, random.Random(5))
            assert render_routine(routine, random.Random(5)) == first, scenario.name
            assert "⟦" not in first[0] + first[1], scenario.name
            assert isinstance(json.loads(first[0]), dict), scenario.name


def test_the_format_refuses_a_result_without_its_call_and_unknown_sections() -> None:
    with pytest.raises(ValueError, match="without its call"):
        parse_scenario("x", "@@@ system\nhi\n@@@ result\nout\n")
    with pytest.raises(ValueError, match="unknown section"):
        parse_scenario("x", "@@@ system\nhi\n@@@ shout\nout\n")


@pytest.mark.parametrize("tokens", [60_000, 400_000])
def test_long_session_reaches_the_size_asked_the_same_way_every_time(tokens: int) -> None:
    scenario = next(s for s in load_scenarios() if s.name == "sre_checkout_latency")
    events = long_session(scenario, tokens=tokens, seed=3)
    size = event_tokens(events)
    assert tokens <= size <= tokens + 3_000
    assert long_session(scenario, tokens=tokens, seed=3) == events
    assert long_session(scenario, tokens=tokens, seed=4) != events
    # The scenario's own events, in order, each once; routine around them; the closing ask.
    own = [e for e in events if e in scenario.events]
    assert own == list(scenario.events)
    assert events[0]["type"] == "SYSTEM_PROMPT"
    assert events[-1] == {"type": "USER_MESSAGE", "content": CLOSING}
    assert facts_kept("\n".join(e["content"] for e in events), scenario.facts) == list(
        scenario.facts
    )


def test_long_session_spreads_the_facts_and_keeps_calls_with_their_results() -> None:
    for scenario in load_scenarios():
        events = long_session(scenario, tokens=150_000, seed=1)
        positions = [k for k, e in enumerate(events) if e in scenario.events[1:]]
        # The scenario's turns are spread over the session, with routine after the last.
        assert positions[0] < len(events) // 4, scenario.name
        assert positions[-1] < len(events) * 0.97, scenario.name
        for k, event in enumerate(events):
            if event["type"] == "TOOL_RESULT":
                assert events[k - 1]["type"] == "TOOL_CALL", scenario.name
                assert events[k - 1]["toolCallId"] == event["toolCallId"], scenario.name
        ids = [e["toolCallId"] for e in events if e["type"] == "TOOL_CALL"]
        assert len(ids) == len(set(ids)), scenario.name
        # The Chat Completions shape the gateway is sent: one message an event.
        assert len(chat_messages(events)) == len(events)
