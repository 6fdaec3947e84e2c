"""GET /usage (served from counters) and GET /context (the messages to send next)."""

from __future__ import annotations

import logging
import math
from urllib.parse import urlencode

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from sessions_app import tokens
from sessions_app.models import ROLE_FOR_TYPE, Event, EventType, Session

SESSIONS = "/api/v1/sessions"
USAGE_KEYS = {
    "totalPromptTokens",
    "totalCompletionTokens",
    "totalTokens",
    "reportedEventCount",
    "contextTokens",
    "contextLimit",
    "percentUsed",
    "nearLimit",
    "atLimit",
    "model",
    "encoding",
    "exact",
    "cumulativeTokens",
    "refreshThresholdTokens",
    "lastCompaction",
    "lastProviderPromptTokens",
    "countDriftPercent",
    "cachedInputTokens",
    "cacheWriteTokens",
    "cacheHitRate",
    "costUsd",
    "costUnknownReason",
    "savedTokens",
    "savedUsd",
    # The scope rule (sessions_app.scope): gateway calls answered and not, the calls with no
    # price, and which scope each kind of figure has.
    "calls",
    "failedCalls",
    "unpricedCalls",
    "scope",
}

CONVERSATION = [
    {"type": "USER_MESSAGE", "content": "Please list the files in src/ and fix the failing test."},
    {
        "type": "AGENT_MESSAGE",
        "content": "Looking.",
        "tokenUsage": {"promptTokens": 120, "completionTokens": 5, "totalTokens": 125},
    },
    {"type": "TOOL_CALL", "name": "ls", "toolCallId": "call_1", "content": '{"path": "src/"}'},
    {
        "type": "TOOL_RESULT",
        "name": "ls",
        "toolCallId": "call_1",
        "content": "app.py\nutil.py\ntest_app.py",
    },
    {"type": "LOCAL_SYSTEM_MESSAGE", "content": "Agent used a tool (shown to people only)."},
    {
        "type": "AGENT_MESSAGE",
        "content": "The test in test_app.py fails on line 12.",
        "tokenUsage": {"promptTokens": 180, "completionTokens": 14, "totalTokens": 194},
    },
    {"type": "USER_MESSAGE", "content": "Fix it — 日本語 and emoji 🚀 welcome."},
]


def create(api, **body):
    body.setdefault("model", "gpt-4o")
    body.setdefault("settings", {"autoCompact": False})
    response = api.post(SESSIONS, body, format="json")
    assert response.status_code == 201, response.json()
    return response.json()


def append(api, session, events):
    response = api.post(f"{SESSIONS}/{session['id']}/events", events, format="json")
    assert response.status_code == 201, response.json()
    return response.json()


def usage(api, session):
    response = api.get(f"{SESSIONS}/{session['id']}/usage")
    assert response.status_code == 200
    return response.json()


def context(api, session, **params):
    return api.get(f"{SESSIONS}/{session['id']}/context", params)


def compacting_context(api, session, **params):
    """POST /context: the ladder that may compact at the hard limit."""
    return api.post(f"{SESSIONS}/{session['id']}/context?{urlencode(params)}")


def tiktoken_context_tokens(encoding: str, events: list[dict]) -> int:
    """The design's accounting, recomputed straight from the tiktoken encoding."""
    enc = tokens.load_encoding(encoding)

    def n(text: str) -> int:
        return len(enc.encode(text, disallowed_special=()))

    costs = [
        3 + n(ROLE_FOR_TYPE[e["type"]]) + n(e["content"]) + (n(e["name"]) if e.get("name") else 0)
        for e in events
        if e["type"] != EventType.LOCAL_SYSTEM_MESSAGE
    ]
    return sum(costs) + 3 if costs else 0


def test_it_returns_exactly_the_design_fields(alice_api):
    session = create(alice_api)
    body = usage(alice_api, session)
    assert set(body) == USAGE_KEYS
    assert body == {
        "totalPromptTokens": 0,
        "totalCompletionTokens": 0,
        "totalTokens": 0,
        "reportedEventCount": 0,
        "contextTokens": 0,
        "contextLimit": 128_000,
        "percentUsed": 0.0,
        "nearLimit": False,
        "atLimit": False,
        "model": "gpt-4o",
        "encoding": "o200k_base",
        "exact": True,
        "cumulativeTokens": 0,
        "refreshThresholdTokens": 800_000,
        "lastCompaction": None,
        "lastProviderPromptTokens": None,
        "countDriftPercent": None,
        "cachedInputTokens": 0,
        "cacheWriteTokens": 0,
        "cacheHitRate": None,
        "costUsd": 0.0,
        "costUnknownReason": None,
        "savedTokens": 0,
        "savedUsd": 0.0,
        "calls": 0,
        "failedCalls": 0,
        "unpricedCalls": 0,
        "scope": {"context": "thread", "thread": "", "bill": "session"},
    }


def test_it_aggregates_provider_reported_usage(alice_api):
    session = create(alice_api, systemPrompt="sys")
    append(alice_api, session, CONVERSATION)
    append(
        alice_api,
        session,
        {"type": "AGENT_MESSAGE", "content": "ok", "tokenUsage": {"promptTokens": 7}},
    )
    body = usage(alice_api, session)
    assert body["totalPromptTokens"] == 120 + 180 + 7
    assert body["totalCompletionTokens"] == 5 + 14
    # The last usage left its total out: it is its prompt + completion, 7.
    assert body["totalTokens"] == 125 + 194 + 7
    assert body["reportedEventCount"] == 3


@pytest.mark.parametrize(
    ("model", "encoding"), [("gpt-4o", "o200k_base"), ("claude-3.5-sonnet", "cl100k_base")]
)
def test_it_counts_the_active_context_exactly(alice_api, model, encoding):
    system = "You are a coding agent. Be precise."
    session = create(alice_api, model=model, systemPrompt=system)
    append(alice_api, session, CONVERSATION)
    body = usage(alice_api, session)
    expected = tiktoken_context_tokens(
        encoding, [{"type": "SYSTEM_PROMPT", "content": system}, *CONVERSATION]
    )
    assert body["contextTokens"] == expected
    assert body["encoding"] == encoding
    ctx = context(alice_api, session)
    assert ctx.status_code == 200
    assert ctx.json()["tokenCount"] == expected
    # Stored per-event counts are the same numbers.
    stored = Event.objects.filter(session_id=session["id"]).exclude(
        type=EventType.LOCAL_SYSTEM_MESSAGE
    )
    assert sum(e.token_count for e in stored) + 3 == expected


def test_it_leaves_local_system_messages_out_of_the_context(alice_api):
    session = create(alice_api)
    append(alice_api, session, {"type": "USER_MESSAGE", "content": "hi"})
    before = usage(alice_api, session)["contextTokens"]
    append(
        alice_api,
        session,
        {"type": "LOCAL_SYSTEM_MESSAGE", "content": "a long note for people " * 50},
    )
    assert usage(alice_api, session)["contextTokens"] == before
    ctx = context(alice_api, session).json()
    assert [m["role"] for m in ctx["messages"]] == ["user"]
    assert ctx["tokenCount"] == before
    # Still stored and counted in the ledger.
    assert Session.objects.get(pk=session["id"]).event_count == 2


def test_it_reports_exact_only_for_the_models_own_encoding(alice_api):
    assert usage(alice_api, create(alice_api, model="gpt-4o"))["exact"] is True
    assert usage(alice_api, create(alice_api, model="claude-3.5-sonnet"))["exact"] is False
    assert usage(alice_api, create(alice_api, model="gemini-3-pro"))["exact"] is False


def test_it_reports_percent_used_to_one_decimal(alice_api):
    session = create(alice_api, model="x-local", contextLimit=777)
    append(alice_api, session, {"type": "USER_MESSAGE", "content": "one two three four five"})
    body = usage(alice_api, session)
    assert body["percentUsed"] == round(100 * body["contextTokens"] / 777, 1)
    assert body["percentUsed"] != 100 * body["contextTokens"] / 777  # really rounded


def test_it_flags_near_and_at_limit_at_the_thresholds(alice_api):
    # 10 tokens per message with o200k: 3 + "user" (1) + six single-token words.
    word = "hello"
    message = {"type": "USER_MESSAGE", "content": " ".join([word] * 6)}
    counter = tokens.counter_for_model("gpt-4o")
    cost = tokens.message_tokens(counter, role="user", content=message["content"])
    limit = 100
    session = create(
        alice_api,
        contextLimit=limit,
        settings={"autoCompact": False, "compactThreshold": 0.5, "hardLimitThreshold": 0.9},
    )
    seen = []
    for _ in range(12):
        append(alice_api, session, message)
        body = usage(alice_api, session)
        ratio = body["contextTokens"] / limit
        assert body["nearLimit"] is (ratio >= 0.5)
        assert body["atLimit"] is (ratio >= 0.9)
        seen.append((body["nearLimit"], body["atLimit"]))
    assert (False, False) in seen and (True, False) in seen and (True, True) in seen
    assert cost > 0


def test_it_flags_exactly_at_the_threshold(alice_api):
    session = create(alice_api, model="x-local", contextLimit=1000, settings={"autoCompact": False})
    append(alice_api, session, {"type": "USER_MESSAGE", "content": "hi"})
    tokens_now = usage(alice_api, session)["contextTokens"]
    # A window where the context is exactly the compact threshold, then one token short of it.
    exact_limit = tokens_now * 5  # ratio exactly 0.2
    alice_api.patch(
        f"{SESSIONS}/{session['id']}",
        {
            "contextLimit": exact_limit,
            "settings": {"compactThreshold": 0.2, "hardLimitThreshold": 0.2},
        },
        format="json",
    )
    body = usage(alice_api, session)
    assert body["nearLimit"] is True and body["atLimit"] is True
    alice_api.patch(f"{SESSIONS}/{session['id']}", {"contextLimit": exact_limit + 1}, format="json")
    body = usage(alice_api, session)
    assert body["nearLimit"] is False and body["atLimit"] is False


def test_it_serves_usage_in_constant_queries(alice_api):
    small = create(alice_api)
    append(alice_api, small, [{"type": "USER_MESSAGE", "content": f"m{i}"} for i in range(5)])
    large = create(alice_api)
    append(alice_api, large, [{"type": "USER_MESSAGE", "content": f"m{i}"} for i in range(200)])
    usage(alice_api, small)  # warm caches (registry, encodings, which threads each has)
    usage(alice_api, large)
    with CaptureQueriesContext(connection) as few:
        usage(alice_api, small)
    with CaptureQueriesContext(connection) as many:
        body = usage(alice_api, large)
    assert len(few.captured_queries) == len(many.captured_queries)
    assert body["contextTokens"] > 0
    assert not any("sessions_app_event" in q["sql"] for q in many.captured_queries)


def test_it_serves_usage_within_a_small_query_budget(alice_api, django_assert_max_num_queries):
    session = create(alice_api)
    append(alice_api, session, [{"type": "USER_MESSAGE", "content": f"m{i}"} for i in range(200)])
    usage(alice_api, session)
    with django_assert_max_num_queries(3):
        usage(alice_api, session)


# --- /context ----------------------------------------------------------------------------


def test_it_renders_the_active_context_in_openai_format(alice_api):
    session = create(alice_api, systemPrompt="sys")
    append(alice_api, session, CONVERSATION)
    body = context(alice_api, session).json()
    assert body["pruned"] is False
    assert body["summary"] is None
    assert body["limit"] == 128_000
    assert body["messages"] == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": CONVERSATION[0]["content"]},
        {
            "role": "assistant",
            "content": "Looking.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "ls", "arguments": '{"path": "src/"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "app.py\nutil.py\ntest_app.py"},
        {"role": "assistant", "content": CONVERSATION[5]["content"]},
        {"role": "user", "content": CONVERSATION[6]["content"]},
    ]


def test_it_groups_parallel_tool_calls_into_one_assistant_turn(alice_api):
    session = create(alice_api)
    append(
        alice_api,
        session,
        [
            {"type": "USER_MESSAGE", "content": "read both"},
            {"type": "TOOL_CALL", "name": "read", "toolCallId": "a", "content": '{"f": "a.py"}'},
            {"type": "TOOL_CALL", "name": "read", "toolCallId": "b", "content": '{"f": "b.py"}'},
            {"type": "TOOL_RESULT", "toolCallId": "a", "content": "A"},
            {"type": "TOOL_RESULT", "toolCallId": "b", "content": "B"},
        ],
    )
    messages = context(alice_api, session).json()["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool"]
    assert messages[1]["content"] is None
    assert [c["id"] for c in messages[1]["tool_calls"]] == ["a", "b"]


def test_it_renders_the_active_context_in_anthropic_format(alice_api):
    session = create(alice_api, model="claude-3.5-sonnet", systemPrompt="sys")
    append(alice_api, session, CONVERSATION)
    body = context(alice_api, session, format="anthropic").json()
    assert body["system"] == "sys"
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": CONVERSATION[0]["content"]}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Looking."},
                {"type": "tool_use", "id": "call_1", "name": "ls", "input": {"path": "src/"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "call_1",
                    "content": "app.py\nutil.py\ntest_app.py",
                }
            ],
        },
        {"role": "assistant", "content": [{"type": "text", "text": CONVERSATION[5]["content"]}]},
        {"role": "user", "content": [{"type": "text", "text": CONVERSATION[6]["content"]}]},
    ]
    assert body["tokenCount"] == usage(alice_api, session)["contextTokens"]


def _long_session(api):
    session = create(api, systemPrompt="You are the system prompt.")
    turns = []
    for i in range(12):
        turns += [
            {"type": "USER_MESSAGE", "content": f"request {i}: " + "please look at this " * 10},
            {"type": "TOOL_CALL", "name": "grep", "toolCallId": f"c{i}", "content": '{"q": "x"}'},
            {
                "type": "TOOL_RESULT",
                "name": "grep",
                "toolCallId": f"c{i}",
                "content": f"hit {i} " * 40,
            },
            {"type": "AGENT_MESSAGE", "content": f"answer {i} " * 15},
        ]
    turns.append({"type": "USER_MESSAGE", "content": "the last question"})
    append(api, session, turns)
    return session


def test_it_prunes_between_the_thresholds(alice_api, caplog):
    session = _long_session(alice_api)
    total = usage(alice_api, session)["contextTokens"]
    # A cap that puts the context between 80 % and 95 % of the window.
    max_tokens = math.ceil(total / 0.87)
    with caplog.at_level(logging.INFO, logger="context"):
        response = context(alice_api, session, maxTokens=max_tokens)
    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["pruned"] is True
    assert body["limit"] == max_tokens
    assert body["tokenCount"] <= int(max_tokens * 0.8)
    messages = body["messages"]
    assert messages[0] == {"role": "system", "content": "You are the system prompt."}
    assert messages[-1] == {"role": "user", "content": "the last question"}
    full = context(alice_api, session).json()["messages"]
    assert len(messages) < len(full)
    # The oldest are dropped: what is kept after the system prompt is the newest tail.
    assert messages[1:] == full[len(full) - len(messages) + 1 :]
    # Never a tool result without its call, nor a call without its result.
    calls = {c["id"] for m in messages for c in m.get("tool_calls", [])}
    results = {m["tool_call_id"] for m in messages if m["role"] == "tool"}
    assert calls == results
    # Usage is unchanged: pruning is a view, not a compaction.
    assert usage(alice_api, session)["contextTokens"] == total
    records = [
        r
        for r in caplog.records
        if r.name == "context" and "context_window_approaching" in r.getMessage()
    ]
    assert records
    assert records[0].tokenCount == total
    assert records[0].limit == max_tokens


def test_it_keeps_the_pruned_token_count_exact(alice_api):
    session = _long_session(alice_api)
    total = usage(alice_api, session)["contextTokens"]
    body = context(alice_api, session, maxTokens=math.ceil(total / 0.87)).json()
    counter = tokens.counter_for_model("gpt-4o")
    costs = []
    for m in body["messages"]:
        if m["role"] == "assistant" and m.get("tool_calls"):
            if m["content"]:
                costs.append(tokens.message_tokens(counter, role="assistant", content=m["content"]))
            for call in m["tool_calls"]:
                costs.append(
                    tokens.message_tokens(
                        counter,
                        role="assistant",
                        content=call["function"]["arguments"],
                        name=call["function"]["name"],
                    )
                )
        elif m["role"] == "tool":
            costs.append(
                tokens.message_tokens(counter, role="tool", content=m["content"], name="grep")
            )
        else:
            costs.append(tokens.message_tokens(counter, role=m["role"], content=m["content"]))
    assert body["tokenCount"] == tokens.context_tokens(costs)


def test_it_does_not_prune_below_the_threshold(alice_api, caplog):
    session = _long_session(alice_api)
    total = usage(alice_api, session)["contextTokens"]
    with caplog.at_level(logging.INFO, logger="context"):
        body = context(alice_api, session, maxTokens=math.ceil(total / 0.7)).json()
    assert body["pruned"] is False
    assert body["tokenCount"] == total
    assert not [r for r in caplog.records if "context_window_approaching" in r.getMessage()]


def test_it_applies_reserve_tokens(alice_api):
    session = _long_session(alice_api)
    total = usage(alice_api, session)["contextTokens"]
    cap = math.ceil(total / 0.7)
    body = context(alice_api, session, maxTokens=cap, reserveTokens=cap // 4).json()
    assert body["limit"] == cap - cap // 4
    assert body["pruned"] is True
    assert body["tokenCount"] <= int(body["limit"] * 0.8)


def test_it_ignores_a_max_tokens_above_the_window(alice_api):
    session = create(alice_api, model="x-local", contextLimit=5000)
    append(alice_api, session, {"type": "USER_MESSAGE", "content": "hi"})
    assert context(alice_api, session, maxTokens=10**7).json()["limit"] == 5000


def test_it_refuses_when_system_prompt_and_last_message_cannot_fit(alice_api):
    session = create(alice_api, model="x-local", contextLimit=100_000, systemPrompt="rules " * 60)
    append(
        alice_api,
        session,
        [
            {"type": "AGENT_MESSAGE", "content": "older"},
            {"type": "USER_MESSAGE", "content": "question " * 60},
        ],
    )
    before = usage(alice_api, session)
    response = context(alice_api, session, maxTokens=50)
    assert response.status_code == 422
    body = response.json()
    assert body["error"] == "context_window_exhausted"
    assert body["detail"]
    assert body["limit"] == 50
    assert body["model"] == "x-local"
    counter = tokens.counter_for_model("x-local")
    required = [
        tokens.message_tokens(counter, role="system", content="rules " * 60),
        tokens.message_tokens(counter, role="user", content="question " * 60),
    ]
    assert body["tokenCount"] == tokens.context_tokens(required)
    assert usage(alice_api, session)["contextTokens"] == before["contextTokens"]


def test_it_answers_an_empty_session_with_no_messages(alice_api):
    session = create(alice_api)
    body = context(alice_api, session).json()
    assert body == {
        "messages": [],
        "tokenCount": 0,
        "limit": 128_000,
        "pruned": False,
        "summary": None,
        "compactionRecommended": False,
    }


def test_it_never_sends_more_than_the_limit_at_the_hard_limit(alice_api):
    # With a cap under the hard threshold the ladder either compacts (when compaction is
    # wired) or prunes; either way the answer fits the budget and keeps the newest question.
    session = _long_session(alice_api)
    total = usage(alice_api, session)["contextTokens"]
    cap = math.ceil(total / 1.5)
    response = context(alice_api, session, maxTokens=cap)
    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["tokenCount"] <= cap
    assert body["messages"][-1] == {"role": "user", "content": "the last question"}


def _runs(api, session) -> list[dict]:
    return api.get(f"{SESSIONS}/{session['id']}/compactions").json()["results"]


def test_it_creates_no_run_when_a_hard_limit_read_has_nothing_to_fold(alice_api):
    session = create(alice_api, systemPrompt="Be terse.")
    append(
        alice_api,
        session,
        [
            {"type": "USER_MESSAGE", "content": "Here is the whole log: " + "line ok " * 400},
            {"type": "AGENT_MESSAGE", "content": "Read it."},
            {"type": "USER_MESSAGE", "content": "Anything wrong?"},
        ],
    )
    assert usage(alice_api, session)["contextTokens"] > 500
    for _ in range(2):
        response = compacting_context(alice_api, session, maxTokens=500)
        assert response.status_code == 200, response.json()
        body = response.json()
        assert body["pruned"] is True and "compaction" not in body
    # The session's strategy folds nothing here: no run, no lastCompaction.
    assert _runs(alice_api, session) == []
    assert usage(alice_api, session)["lastCompaction"] is None


def test_it_creates_at_most_one_run_for_two_identical_hard_limit_reads(alice_api):
    session = create(
        alice_api,
        systemPrompt="You are the system prompt.",
        settings={"autoCompact": False, "maxSummaryTokens": 100},
    )
    turns = []
    for i in range(12):
        turns += [
            {"type": "USER_MESSAGE", "content": f"request {i}: please look at this"},
            {"type": "TOOL_CALL", "name": "grep", "toolCallId": f"c{i}", "content": '{"q": "x"}'},
            {"type": "TOOL_RESULT", "toolCallId": f"c{i}", "content": f"hit {i} " * 40},
            {"type": "AGENT_MESSAGE", "content": f"answer {i} " * 15},
        ]
    append(alice_api, session, turns + [{"type": "USER_MESSAGE", "content": "the last question"}])
    first = compacting_context(alice_api, session, maxTokens=400)
    assert first.status_code == 200, first.json()
    assert first.json()["compaction"]["trigger"] == "hard_limit"
    second = compacting_context(alice_api, session, maxTokens=400)
    assert second.status_code == 200, second.json()
    # Still over the cap after the run, but nothing is left to fold: the ladder prunes.
    assert second.json()["pruned"] is True and "compaction" not in second.json()
    assert [run["id"] for run in _runs(alice_api, session)] == [first.json()["compaction"]["id"]]
    assert usage(alice_api, session)["lastCompaction"]["id"] == first.json()["compaction"]["id"]
