"""The prose-heavy session generator: deterministic by seed, API-shaped events, each fact said
once in the message it is recorded against, and no conclusion worded with decision words."""

from __future__ import annotations

import json

import pytest

from compaction_app.testkit.prose_gen import BANNED, generate_prose_session

pytestmark = pytest.mark.profile_independent

TYPES = {"SYSTEM_PROMPT", "USER_MESSAGE", "AGENT_MESSAGE", "TOOL_CALL", "TOOL_RESULT"}


@pytest.fixture(scope="module")
def session():
    return generate_prose_session(seed=1)


def test_it_is_deterministic_by_seed(session) -> None:
    again = generate_prose_session(seed=1)
    assert again.events == session.events
    assert again.facts == session.facts
    other = generate_prose_session(seed=2)
    assert other.events != session.events
    assert other.facts != session.facts


def test_it_produces_events_in_the_api_shape_with_every_call_answered(session) -> None:
    events = session.events
    assert events[0]["type"] == "SYSTEM_PROMPT"
    for index, event in enumerate(events):
        assert event["type"] in TYPES
        assert isinstance(event["content"], str) and event["content"]
        if event["type"] == "TOOL_CALL":
            json.loads(event["content"])
            following = events[index + 1]
            assert following["type"] == "TOOL_RESULT"
            assert following["toolCallId"] == event["toolCallId"]
    calls = [e["toolCallId"] for e in events if e["type"] == "TOOL_CALL"]
    assert len(calls) == len(set(calls))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_it_states_each_fact_once_in_the_message_it_records(seed: int) -> None:
    session = generate_prose_session(seed=seed)
    assert len(session.facts) >= 14
    assert len(set(session.facts)) == len(session.facts)
    for fact in session.facts:
        holders = [i for i, e in enumerate(session.events) if fact in e["content"]]
        assert holders == [session.fact_events[fact]], fact
        assert session.events[holders[0]]["type"] in ("AGENT_MESSAGE", "USER_MESSAGE")
    # Most facts are the agent's own conclusions, all before the last 15 % of the session.
    said_by_agent = [
        f
        for f in session.facts
        if session.events[session.fact_events[f]]["type"] == "AGENT_MESSAGE"
    ]
    assert len(said_by_agent) >= 12
    assert max(session.fact_events.values()) < 0.9 * len(session.events)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_it_words_no_message_with_decision_words(seed: int) -> None:
    session = generate_prose_session(seed=seed)
    for event in session.events:
        if event["type"] in ("AGENT_MESSAGE", "USER_MESSAGE"):
            text = event["content"].lower()
            assert not [word for word in BANNED if word in text], event["content"]
