"""POST /sessions/{id}/recall (original events as messages within a budget) and the
`ledger_recall` tool that /context offers once a session has folded events."""

from __future__ import annotations

import pytest

from compaction_app.models import RunStatus
from compaction_app.services import compaction_execute, compaction_request
from sessions_app.models import Event, Session
from tests.support.helpers import append_events, create_session

SESSIONS = "/api/v1/sessions"

DEPLOY = [
    {"type": "USER_MESSAGE", "content": "Check the deploy log for ERR_QUOTA_EXCEEDED."},
    {
        "type": "TOOL_CALL",
        "name": "bash",
        "toolCallId": "call_log",
        "content": '{"cmd": "tail -n 3 deploy.log"}',
    },
    {
        "type": "TOOL_RESULT",
        "name": "bash",
        "toolCallId": "call_log",
        "content": "12:01 worker-3 ERR_QUOTA_EXCEEDED tenant=acme limit=5000\nexit status 1",
    },
    {"type": "AGENT_MESSAGE", "content": "The quota of 5000 was hit by tenant acme."},
    {"type": "LOCAL_SYSTEM_MESSAGE", "content": "note for people: ERR_QUOTA_EXCEEDED seen"},
]
FILLER = [{"type": "AGENT_MESSAGE", "content": f"step {n} " * 150} for n in range(10)]
LAST = [{"type": "USER_MESSAGE", "content": "Now write the fix."}]


def folded_session(api, *, strategy="trim") -> str:
    """A session whose DEPLOY events (seq 2..6) are folded by a completed run."""
    session_id = create_session(api, limit=3000)
    append_events(api, session_id=session_id, events=DEPLOY + FILLER + LAST)
    session = Session.objects.get(pk=session_id)
    run = compaction_request(session=session, user=None, strategy=strategy, enqueue=False)
    run = compaction_execute(run_id=run.pk)
    assert run.status == RunStatus.COMPLETED, run.error
    assert Event.objects.get(session=session, seq=4).compacted_by_id is not None
    return session_id


def recall(api, session_id, **body):
    return api.post(f"{SESSIONS}/{session_id}/recall", body, format="json")


def recalled(api, session_id, **body) -> dict:
    response = recall(api, session_id, **body)
    assert response.status_code == 200, response.json()
    return response.json()


def assert_valid_openai(messages: list[dict]) -> None:
    """Every tool message answers a call of the assistant turn right before its run."""
    open_calls: set[str] = set()
    for message in messages:
        if message["role"] == "tool":
            assert message["tool_call_id"] in open_calls, messages
            open_calls.discard(message["tool_call_id"])
            continue
        assert not open_calls, f"unanswered calls {open_calls}"
        open_calls = {call["id"] for call in message.get("tool_calls") or []}
    assert not open_calls


@pytest.mark.django_db
def test_it_recalls_folded_originals_by_query_with_tool_pairs_whole(alice_api):
    session_id = folded_session(alice_api)
    body = recalled(alice_api, session_id, query="ERR_QUOTA_EXCEEDED")
    # The user message and the tool result match; the result brings its call along. The
    # people-only note matches too but is never sent to a model.
    # (default budget: 4,000 tokens or the session's window if smaller)
    assert [e["seq"] for e in body["events"]] == [2, 3, 4]
    assert all(e["folded"] for e in body["events"])
    assert body["messages"] == [
        {"role": "user", "content": DEPLOY[0]["content"]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_log",
                    "type": "function",
                    "function": {"name": "bash", "arguments": DEPLOY[1]["content"]},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_log", "content": DEPLOY[2]["content"]},
    ]
    assert_valid_openai(body["messages"])
    stored = Event.objects.filter(session_id=session_id, seq__in=[2, 3, 4])
    assert body["tokenCount"] == sum(e.token_count for e in stored)
    assert body["maxTokens"] == 3000 and body["omitted"] == [] and body["missing"] == []


@pytest.mark.django_db
def test_it_recalls_by_seqs_in_anthropic_format(alice_api):
    session_id = folded_session(alice_api)
    body = recalled(alice_api, session_id, seqs=[3, 5], format="anthropic")
    assert [e["seq"] for e in body["events"]] == [3, 4, 5]  # the call's result comes with it
    messages = body["messages"]
    blocks = [block for message in messages for block in message["content"]]
    tool_use = next(b for b in blocks if b["type"] == "tool_use")
    tool_result = next(b for b in blocks if b["type"] == "tool_result")
    assert tool_use == {
        "type": "tool_use",
        "id": "call_log",
        "name": "bash",
        "input": {"cmd": "tail -n 3 deploy.log"},
    }
    assert tool_result["tool_use_id"] == "call_log"
    roles = [message["role"] for message in messages]
    assert all(a != b for a, b in zip(roles, roles[1:], strict=False))  # roles alternate
    use_at = next(i for i, m in enumerate(messages) if tool_use in m["content"])
    assert messages[use_at]["role"] == "assistant"
    assert tool_result in messages[use_at + 1]["content"]
    assert "system" in body


@pytest.mark.django_db
def test_it_fills_the_budget_newest_first_and_lists_what_did_not_fit(alice_api):
    session_id = folded_session(alice_api)
    costs = {e.seq: e.token_count for e in Event.objects.filter(session_id=session_id)}
    pair = costs[3] + costs[4]
    # Room for the tool pair (the best hit) but not also for the user message.
    body = recalled(alice_api, session_id, query="ERR_QUOTA_EXCEEDED", maxTokens=pair)
    assert body["tokenCount"] <= pair
    assert [e["seq"] for e in body["events"]] == [3, 4]
    assert body["omitted"] == [2]

    by_seq = recalled(alice_api, session_id, seqs=[2, 5, 12], maxTokens=costs[12] + costs[5])
    assert [e["seq"] for e in by_seq["events"]] == [5, 12]  # newest first: 12, then 5
    assert by_seq["omitted"] == [2]

    nothing = recalled(alice_api, session_id, seqs=[3], maxTokens=costs[3])
    assert nothing["events"] == [] and nothing["omitted"] == [3]  # a pair is never split


@pytest.mark.django_db
def test_it_reports_missing_seqs_and_skips_events_never_sent_to_a_model(alice_api):
    session_id = folded_session(alice_api)
    body = recalled(alice_api, session_id, seqs=[6, 999, 2])
    assert body["missing"] == [999]
    assert [e["seq"] for e in body["events"]] == [2]  # 6 is a LOCAL_SYSTEM_MESSAGE
    assert recalled(alice_api, session_id, query="!!!")["events"] == []


@pytest.mark.django_db
def test_it_recalls_the_original_of_a_cleared_tool_result(alice_api):
    session_id = create_session(alice_api, limit=100_000)
    turns = []
    for n in range(6):
        turns += [
            {"type": "TOOL_CALL", "name": "cat", "toolCallId": f"c{n}", "content": "{}"},
            {
                "type": "TOOL_RESULT",
                "name": "cat",
                "toolCallId": f"c{n}",
                "content": f"payload_{n} " * 200,
            },
        ]
    append_events(alice_api, session_id=session_id, events=[*turns, *LAST])
    session = Session.objects.get(pk=session_id)
    run = compaction_request(
        session=session, user=None, strategy="clear_tool_results", enqueue=False
    )
    assert compaction_execute(run_id=run.pk).status == RunStatus.COMPLETED
    cleared = Event.objects.get(session=session, seq=3)
    assert cleared.cleared_content is not None

    body = recalled(alice_api, session_id, query="payload_0")
    tool = next(m for m in body["messages"] if m["role"] == "tool")
    assert tool["content"] == cleared.content
    context = alice_api.get(f"{SESSIONS}/{session_id}/context").json()
    assert context["tools"][0]["function"]["name"] == "ledger_recall"


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "query"),
        ({"query": "x", "seqs": [1]}, "query"),
        ({"seqs": []}, "seqs"),
        ({"seqs": [0]}, "seqs"),
        ({"seqs": ["a"]}, "seqs"),
        ({"seqs": list(range(1, 202))}, "seqs"),
        ({"query": "x", "maxTokens": 0}, "maxTokens"),
        ({"query": "x", "maxTokens": 3001}, "maxTokens"),
        ({"query": "x", "format": "gemini"}, "format"),
        ({"query": "x" * 501}, "query"),
    ],
)
def test_it_rejects_a_bad_recall_body(alice_api, body, field):
    session_id = create_session(alice_api, limit=3000)
    response = recall(alice_api, session_id, **body)
    assert response.status_code == 400, response.json()
    assert any(key.startswith(field) for key in response.json()["fields"])


@pytest.mark.django_db
def test_it_rejects_a_recall_body_that_is_not_an_object(alice_api):
    session_id = create_session(alice_api)
    response = alice_api.post(f"{SESSIONS}/{session_id}/recall", [1, 2], format="json")
    assert response.status_code == 400
    assert response.json()["error"] == "invalid_request"


@pytest.mark.django_db
def test_it_keeps_other_users_out_of_recall(alice_api, bob_api):
    session_id = folded_session(alice_api)
    assert recall(bob_api, session_id, query="ERR_QUOTA_EXCEEDED").status_code == 404
    assert recall(bob_api, session_id, seqs=[2]).status_code == 404


@pytest.mark.django_db
def test_it_offers_the_ledger_recall_tool_only_once_events_are_folded(alice_api):
    fresh = create_session(alice_api, limit=3000)
    append_events(alice_api, session_id=fresh, events=DEPLOY)
    assert "tools" not in alice_api.get(f"{SESSIONS}/{fresh}/context").json()

    session_id = folded_session(alice_api)
    openai_tool = alice_api.get(f"{SESSIONS}/{session_id}/context").json()["tools"]
    assert len(openai_tool) == 1
    assert openai_tool[0]["type"] == "function"
    function = openai_tool[0]["function"]
    assert function["name"] == "ledger_recall"
    assert set(function["parameters"]["properties"]) == {"query", "seqs", "maxTokens"}

    anthropic = alice_api.get(f"{SESSIONS}/{session_id}/context?format=anthropic").json()
    tool = anthropic["tools"][0]
    assert set(tool) == {"name", "description", "input_schema"}
    assert tool["name"] == "ledger_recall"
    assert tool["input_schema"] == function["parameters"]


@pytest.mark.django_db
def test_it_returns_messages_the_official_sdks_send(alice_api, fake):
    import anthropic
    import openai

    session_id = folded_session(alice_api)
    context = alice_api.get(f"{SESSIONS}/{session_id}/context").json()
    body = recalled(alice_api, session_id, query="ERR_QUOTA_EXCEEDED")
    client = openai.OpenAI(base_url=fake.openai_url, api_key="k", max_retries=0)
    client.chat.completions.create(
        model="gpt-4o", messages=body["messages"] + context["messages"], tools=context["tools"]
    )
    sent = fake.requests[-1].body
    assert sent["messages"][:3] == body["messages"]
    assert sent["tools"][0]["function"]["name"] == "ledger_recall"

    anthropic_context = alice_api.get(f"{SESSIONS}/{session_id}/context?format=anthropic").json()
    body = recalled(alice_api, session_id, query="ERR_QUOTA_EXCEEDED", format="anthropic")
    client_a = anthropic.Anthropic(base_url=fake.anthropic_url, api_key="k", max_retries=0)
    client_a.messages.create(
        model="claude-3-5-sonnet-latest",
        max_tokens=100,
        messages=body["messages"],
        tools=anthropic_context["tools"],
    )
    sent = fake.requests[-1].body
    assert sent["messages"] == body["messages"]
    assert sent["tools"][0]["input_schema"]["properties"]["seqs"]["type"] == "array"
