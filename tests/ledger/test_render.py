"""The renderer of contexts (sessions_app/render.py) and what /context and export emit: for any
stored event sequence, the OpenAI and Anthropic lists pass each provider's structural rules
(tests/provider_rules.py), with unpaired tool calls and results repaired in plain words."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from django.core.management import call_command
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sessions_app import render
from sessions_app.render import MISSING_RESULT_TEXT, Record
from tests.support.helpers import all_events, append_events, compact_and_wait, create_session
from tests.support.provider_rules import check_anthropic, check_openai

TYPES = [
    "SYSTEM_PROMPT",
    "USER_MESSAGE",
    "AGENT_MESSAGE",
    "TOOL_CALL",
    "TOOL_RESULT",
    "LOCAL_SYSTEM_MESSAGE",
    "COMPACTION",
    "CONTEXT_REFRESH",
]
CALL_IDS = ["a", "b", "c", "call_1", "x.y", "id with space"]
CONTENTS = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["", "  ", '{"path": "a.py"}', "[1, 2]", "null", "ends with space "]),
    st.just([{"type": "text", "text": "parts"}]),
    st.just({"k": 1}),
)
NAMES = st.sampled_from(["", "read_file", "alice smith", "a/b"])

RAW_EVENTS = st.lists(
    st.tuples(st.sampled_from(TYPES), st.sampled_from(CALL_IDS), CONTENTS, NAMES, st.booleans()),
    max_size=30,
)


def _records(raw: list[tuple[str, str, Any, str, bool]]) -> list[Record]:
    """Records in seq order; the flag drops an event, as folding or pruning would."""
    return [
        Record(
            key=str(index),
            type=kind,
            content=content,
            name=name or ("tool" if kind == "TOOL_CALL" else ""),
            tool_call_id=call_id if kind in ("TOOL_CALL", "TOOL_RESULT") else "",
        )
        for index, (kind, call_id, content, name, dropped) in enumerate(raw)
        if not dropped
    ]


# --- the pure renderer -------------------------------------------------------------------------


@settings(max_examples=400, deadline=None)
@given(RAW_EVENTS)
def test_it_always_emits_a_valid_openai_list(raw):
    records = _records(raw)
    messages = render.to_openai(records).messages
    check_openai(messages)
    # One order everywhere: every system message (prompt, then summary) comes first.
    roles = [m["role"] for m in messages]
    assert roles == sorted(roles, key=lambda role: role != "system")


@settings(max_examples=400, deadline=None)
@given(RAW_EVENTS)
def test_it_always_emits_a_valid_anthropic_list(raw):
    rendered = render.to_anthropic(_records(raw))
    check_anthropic(rendered.messages, rendered.system)


@settings(max_examples=200, deadline=None)
@given(RAW_EVENTS)
def test_it_keeps_every_recorded_tool_result_and_reports_each_repair(raw):
    records = _records(raw)
    rendered = render.to_openai(records)
    text = json.dumps(rendered.messages, ensure_ascii=False)
    for record in records:
        if record.type == "TOOL_RESULT":
            # Sent as text, or (a tool result made of content parts) as the parts themselves.
            as_text = json.dumps(render.text_of(record.content), ensure_ascii=False)[1:-1]
            as_parts = json.dumps(record.content, ensure_ascii=False)
            assert as_text in text or as_parts in text
    synthesized = [m for m in rendered.messages if m.get("content") == MISSING_RESULT_TEXT]
    missing = [r for r in rendered.repairs if r.kind == "missing_result"]
    assert len(missing) == len(synthesized)


def test_it_orders_system_prompt_summary_then_events():
    records = [
        Record("1", "USER_MESSAGE", "hi"),
        Record("2", "SYSTEM_PROMPT", "sys"),
        Record("3", "AGENT_MESSAGE", "hello"),
        Record("4", "COMPACTION", "the summary"),
        Record("5", "COMPACTION", ""),  # a trim's marker: never sent
        Record("6", "LOCAL_SYSTEM_MESSAGE", "for people"),
    ]
    assert render.to_openai(records).messages == [
        {"role": "system", "content": "sys"},
        {"role": "system", "content": "the summary"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
    ]
    anthropic = render.to_anthropic(records)
    assert anthropic.system == "sys\n\nthe summary"


def test_it_moves_a_late_result_up_to_its_call():
    records = [
        Record("1", "USER_MESSAGE", "go"),
        Record("2", "TOOL_CALL", "{}", name="ls", tool_call_id="c1"),
        Record("3", "USER_MESSAGE", "still there?"),
        Record("4", "TOOL_RESULT", "a.py", tool_call_id="c1"),
    ]
    messages = render.to_openai(records).messages
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "user"]
    assert messages[2]["content"] == "a.py"


# --- through the API and the export ------------------------------------------------------------


def _context(api, session_id: str, fmt: str, **params: Any) -> dict[str, Any]:
    response = api.get(f"/api/v1/sessions/{session_id}/context", {"format": fmt, **params})
    assert response.status_code == 200, response.json()
    return response.json()


def _export(session_id: str, *args: str) -> list[dict[str, Any]]:
    out = io.StringIO()
    call_command("export_session", session_id, *args, stdout=out, stderr=io.StringIO())
    return [json.loads(line) for line in out.getvalue().splitlines()]


@pytest.mark.django_db
def test_it_sends_an_orphan_tool_result_as_text_that_says_so(alice_api):
    session_id = create_session(alice_api, limit=100_000)
    append_events(
        alice_api,
        session_id=session_id,
        events=[
            {"type": "USER_MESSAGE", "content": "What did the tool say?"},
            {"type": "TOOL_RESULT", "toolCallId": "ghost", "name": "grep", "content": "42 hits"},
            {"type": "AGENT_MESSAGE", "content": "It found 42 hits."},
        ],
    )
    body = _context(alice_api, session_id, "openai")
    orphan = "[tool result for call ghost (grep), whose call is not in this context]\n42 hits"
    assert body["messages"][1:] == [
        {"role": "user", "content": "What did the tool say?"},
        {"role": "user", "content": orphan},
        {"role": "assistant", "content": "It found 42 hits."},
    ]
    check_openai(body["messages"])
    # tokenCount prices what is sent, rewritten message included.
    counted = alice_api.post(
        "/api/v1/tokens/count", {"model": "gpt-4o", "messages": body["messages"]}, format="json"
    ).json()
    assert body["tokenCount"] == counted["tokens"]

    anthropic = _context(alice_api, session_id, "anthropic")
    check_anthropic(anthropic["messages"], anthropic["system"])
    assert anthropic["messages"][0]["content"][1] == {"type": "text", "text": orphan}
    check_openai(_export(session_id))


@pytest.mark.django_db
def test_it_answers_a_tool_call_with_no_recorded_result(alice_api):
    session_id = create_session(alice_api, limit=100_000)
    append_events(
        alice_api,
        session_id=session_id,
        events=[
            {"type": "USER_MESSAGE", "content": "Run the tests."},
            {"type": "TOOL_CALL", "name": "pytest", "toolCallId": "t1", "content": "{}"},
            {"type": "AGENT_MESSAGE", "content": "The runner died."},
        ],
    )
    messages = _context(alice_api, session_id, "openai")["messages"]
    assert messages[2:] == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "t1", "type": "function", "function": {"name": "pytest", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "t1", "content": MISSING_RESULT_TEXT},
        {"role": "assistant", "content": "The runner died."},
    ]
    anthropic = _context(alice_api, session_id, "anthropic")
    check_anthropic(anthropic["messages"], anthropic["system"])
    assert anthropic["messages"][2]["content"][0] == {
        "type": "tool_result",
        "tool_use_id": "t1",
        "content": MISSING_RESULT_TEXT,
    }


@pytest.mark.django_db(transaction=True)
def test_it_repairs_a_result_whose_call_a_compaction_folded(worker, alice_api):
    session_id = create_session(alice_api, limit=100_000, keepRecentEvents=0)
    append_events(
        alice_api,
        session_id=session_id,
        events=[
            {"type": "USER_MESSAGE", "content": "Build it."},
            {"type": "TOOL_CALL", "name": "make", "toolCallId": "m1", "content": "{}"},
            {"type": "USER_MESSAGE", "content": "Status?"},
        ],
    )
    run = compact_and_wait(alice_api, session_id=session_id, strategy="summarize")
    assert run["status"] == "completed"
    call = next(e for e in all_events(alice_api, session_id=session_id) if e["toolCallId"] == "m1")
    assert call["compactedBy"] is not None
    # The call is folded; its result arrives afterwards.
    append_events(
        alice_api,
        session_id=session_id,
        events={"type": "TOOL_RESULT", "toolCallId": "m1", "content": "build ok"},
    )
    body = _context(alice_api, session_id, "openai")
    check_openai(body["messages"])
    assert body["messages"][-1] == {
        "role": "user",
        "content": "[tool result for call m1, whose call is not in this context]\nbuild ok",
    }
    anthropic = _context(alice_api, session_id, "anthropic")
    check_anthropic(anthropic["messages"], anthropic["system"])
    check_openai(_export(session_id))


API_EVENTS = st.lists(
    st.tuples(
        st.sampled_from(
            ["USER_MESSAGE", "AGENT_MESSAGE", "TOOL_CALL", "TOOL_RESULT", "LOCAL_SYSTEM_MESSAGE"]
        ),
        st.sampled_from(["a", "b", "c", "d.1"]),
        st.sampled_from(["", "ok", '{"q": 1}', "[1]", "a longer piece of text " * 8]),
    ),
    min_size=1,
    max_size=14,
)


@pytest.mark.django_db
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    events=API_EVENTS,
    strategy=st.sampled_from([None, "trim", "summarize", "clear_tool_results"]),
    target=st.sampled_from([0.05, 0.3, 0.8]),
    max_tokens=st.sampled_from([None, 120, 400]),
)
def test_it_emits_valid_lists_for_any_stored_sequence(
    alice_api, events, strategy, target, max_tokens
):
    from compaction_app import services
    from sessions_app.models import Session

    session_id = create_session(alice_api, limit=2000, keepRecentEvents=1)
    append_events(
        alice_api,
        session_id=session_id,
        events=[
            {
                "type": kind,
                "content": content,
                **({"toolCallId": call_id} if kind in ("TOOL_CALL", "TOOL_RESULT") else {}),
                **({"name": "tool"} if kind == "TOOL_CALL" else {}),
            }
            for kind, call_id, content in events
        ],
    )
    if strategy is not None:
        # Fold (or clear) part of the ledger with a real run, in this thread.
        session = Session.objects.get(pk=session_id)
        run = services.compaction_request(
            session=session, user=None, strategy=strategy, target_ratio=target, enqueue=False
        )
        services.compaction_execute(run_id=run.pk)
    params = {"maxTokens": max_tokens} if max_tokens else {}
    for fmt in ("openai", "anthropic"):
        response = alice_api.get(
            f"/api/v1/sessions/{session_id}/context", {"format": fmt, **params}
        )
        if response.status_code == 422:
            assert response.json()["error"] == "context_window_exhausted"
            continue
        assert response.status_code == 200, response.json()
        body = response.json()
        if fmt == "openai":
            check_openai(body["messages"])
        else:
            check_anthropic(body["messages"], body["system"])
    check_openai(_export(session_id))
    check_openai(_export(session_id, "--include-compacted"))
