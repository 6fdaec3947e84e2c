"""The benchmark session generator: deterministic, API-shaped, complete tool pairs, facts planted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from compaction_app.testkit.session_gen import generate_session, main, to_chat_messages

pytestmark = pytest.mark.profile_independent

TYPES = {"SYSTEM_PROMPT", "USER_MESSAGE", "AGENT_MESSAGE", "TOOL_CALL", "TOOL_RESULT"}


@pytest.fixture(scope="module")
def session():
    return generate_session()


def test_it_is_deterministic_by_seed(session) -> None:
    again = generate_session()
    assert again.events == session.events
    assert again.facts == session.facts
    other = generate_session(seed=8)
    assert other.events != session.events


def test_it_produces_events_in_the_api_shape(session) -> None:
    events = session.events
    assert events[0]["type"] == "SYSTEM_PROMPT"
    assert sum(e["type"] == "SYSTEM_PROMPT" for e in events) == 1
    assert sum(e["type"] == "USER_MESSAGE" for e in events) == 500
    for event in events:
        assert event["type"] in TYPES
        assert isinstance(event["content"], str) and event["content"]
        if event["type"] in ("TOOL_CALL", "TOOL_RESULT"):
            assert event["name"] and event["toolCallId"]
        if event["type"] == "TOOL_CALL":
            json.loads(event["content"])
        if event["type"] == "AGENT_MESSAGE":
            usage = event["tokenUsage"]
            assert usage["totalTokens"] == usage["promptTokens"] + usage["completionTokens"]


def test_it_pairs_every_tool_call_with_a_result(session) -> None:
    calls = [e["toolCallId"] for e in session.events if e["type"] == "TOOL_CALL"]
    results = [e["toolCallId"] for e in session.events if e["type"] == "TOOL_RESULT"]
    assert len(calls) == len(set(calls))
    assert sorted(calls) == sorted(results)
    for index, event in enumerate(session.events):
        if event["type"] == "TOOL_CALL":
            following = session.events[index + 1]
            assert following["type"] == "TOOL_RESULT"
            assert following["toolCallId"] == event["toolCallId"]


def test_it_plants_facts_in_user_and_agent_messages_early(session) -> None:
    assert len(session.facts) >= 20
    assert len(set(session.facts)) == len(session.facts)
    last_user = max(i for i, e in enumerate(session.events) if e["type"] == "USER_MESSAGE")
    for fact in session.facts:
        index = session.fact_events[fact]
        event = session.events[index]
        assert event["type"] in ("USER_MESSAGE", "AGENT_MESSAGE")
        assert fact in event["content"]
        assert index < 0.85 * last_user


def test_it_lands_near_the_token_target_with_a_real_tokenizer(session) -> None:
    tokens = pytest.importorskip("sessions_app.tokens")
    counter = tokens.get_counter("o200k_base")
    if not counter.exact:
        pytest.skip("o200k_base vocabulary not available")
    roles = {
        "SYSTEM_PROMPT": "system",
        "USER_MESSAGE": "user",
        "AGENT_MESSAGE": "assistant",
        "TOOL_CALL": "assistant",
        "TOOL_RESULT": "tool",
    }
    costs = tokens.messages_batch_tokens(
        counter, [(roles[e["type"]], e["content"], e.get("name", "")) for e in session.events]
    )
    total = tokens.context_tokens(costs)
    assert 940_000 * 0.95 <= total <= 940_000 * 1.05


def test_it_writes_openai_chat_jsonl(tmp_path: Path, session) -> None:
    out = tmp_path / "session.jsonl"
    assert main(["--out", str(out), "--turns", "20", "--target-tokens", "30000"]) == 0
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines[0]["role"] == "system"
    pending: set[str] = set()
    for message in lines:
        assert set(message) <= {"role", "content", "tool_calls", "tool_call_id"}
        if message.get("tool_calls"):
            assert message["role"] == "assistant"
            for call in message["tool_calls"]:
                assert call["type"] == "function"
                json.loads(call["function"]["arguments"])
                pending.add(call["id"])
        if message["role"] == "tool":
            pending.remove(message["tool_call_id"])
    assert not pending
    assert len(to_chat_messages(session.events)) == len(session.events)
