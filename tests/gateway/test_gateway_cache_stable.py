"""Cache-stable fitting through the official SDKs: once fitting starts, each forwarded request
is the previous one plus the new turns, byte for byte, except at a compaction; the request
keeps its shape (system blocks, cache_control markers, the text beside a tool call); nothing
forwarded exceeds the hard limit and the newest turn is always last."""

from __future__ import annotations

import json

import pytest
from django.db import connections

from compaction_app.gateway import after, shape, workers
from compaction_app.gateway.providers.anthropic_messages import shape as breakpoints
from compaction_app.testkit.provider_standin import Received, Step
from sessions_app.models import Session
from sessions_app.services import session_update
from tests.support.gateway_live import anthropic_client, openai_client, token_for

pytestmark = pytest.mark.django_db(transaction=True)

WINDOW = 6000
TURNS = 90


def _messages_bytes(raw: bytes) -> str:
    """The forwarded body's `messages` array exactly as it was sent."""
    text = raw.decode()
    start = text.index("[", text.index('"messages"'))
    _, end = json.JSONDecoder().raw_decode(text, start)
    return text[start:end]


def prefix_stable(previous: Received, current: Received) -> bool:
    """Whether `current` is `previous` plus new messages: every other field the same, and
    the bytes of the previous messages (up to their closing bracket) begin the current ones."""
    rest = [{k: v for k, v in r.body.items() if k != "messages"} for r in (previous, current)]
    if rest[0] != rest[1]:
        return False
    return _messages_bytes(current.raw).startswith(_messages_bytes(previous.raw)[:-1])


def stable_share(forwarded: list[Received], first_fitted: int) -> tuple[int, int]:
    pairs = list(zip(forwarded[first_fitted:], forwarded[first_fitted + 1 :], strict=False))
    return sum(prefix_stable(a, b) for a, b in pairs), len(pairs)


def _small_window(client_key: str) -> None:
    session = Session.objects.get(client_key=client_key)
    # Auto compaction stays on: the gateway's own compaction in the call path comes first.
    session_update(session=session, context_limit=WINDOW)


def _tool_output(turn: int) -> str:
    return f"line {turn}: " + "def handler(request): return respond(request.body)\n" * 25


def test_it_keeps_the_forwarded_prefix_stable_on_chat_completions(gateway_url, upstream, alice):
    client = openai_client(gateway_url, key=token_for(alice), session="stable-openai")
    history: list[dict] = [{"role": "system", "content": "You are a coding agent."}]
    tools = [{"type": "function", "function": {"name": "read_file", "parameters": {}}}]
    fitted_at = None
    headers = []
    for turn in range(TURNS):
        history.append({"role": "user", "content": f"Step {turn}: look at module_{turn}.py. " * 6})
        if turn % 3 == 0:
            upstream.script(
                Step(text="Reading it.", tool_calls=((f"call_{turn}", "read_file", "{}"),))
            )
            reply = client.chat.completions.create(model="gpt-4o", messages=history, tools=tools)
            message = reply.choices[0].message
            history.append(
                {
                    "role": "assistant",
                    "content": message.content,
                    "tool_calls": [c.model_dump() for c in message.tool_calls or []],
                }
            )
            history.append(
                {"role": "tool", "tool_call_id": f"call_{turn}", "content": _tool_output(turn)}
            )
        raw = client.chat.completions.with_raw_response.create(
            model="gpt-4o", messages=history, tools=tools
        )
        headers.append(raw.headers)
        forwarded = upstream.requests[-1].body["messages"]
        # The newest turn is always last, as the client sent it.
        assert forwarded[-1] == history[-1]
        if turn == 0:
            _small_window("stable-openai")
        if fitted_at is None and raw.headers["X-Ledger-Compacted"] == "true":
            fitted_at = len(upstream.requests) - 1
        history.append({"role": "assistant", "content": raw.parse().choices[0].message.content})
    after.wait_idle()
    assert fitted_at is not None, "the conversation never reached the compact threshold"
    # Never over the hard limit (95 % of the window, tool definitions included).
    assert all(int(h["X-Ledger-Context-Tokens"]) <= 0.95 * WINDOW for h in headers)
    stable, pairs = stable_share(upstream.requests, fitted_at)
    print(f"chat completions: {stable}/{pairs} forwarded requests prefix-stable")
    assert stable >= 0.9 * pairs
    # The assistant text that went with a tool call is still beside it after fitting.
    last = upstream.requests[-1].body["messages"]
    assert any(m.get("tool_calls") and m.get("content") == "Reading it." for m in last)
    # Summaries sit after the client's own system message, rendered the same each time.
    assert last[0] == history[0]
    assert last[1]["role"] == "system" and last[1]["content"].startswith(shape.SUMMARY_HEADER)


def test_it_keeps_the_forwarded_prefix_stable_on_messages_with_its_shape(
    gateway_url, upstream, alice
):
    client = anthropic_client(gateway_url, key=token_for(alice), session="stable-anthropic")
    system = [
        {"type": "text", "text": "You are Claude Code."},
        {"type": "text", "text": "Project notes.", "cache_control": {"type": "ephemeral"}},
    ]
    tools = [
        {
            "name": "read_file",
            "input_schema": {"type": "object"},
            "cache_control": {"type": "ephemeral"},
        }
    ]
    history: list[dict] = []
    fitted_at = None
    restarted_at = None
    for turn in range(TURNS):
        history.append(
            {"role": "user", "content": [{"type": "text", "text": f"Step {turn}. " * 30}]}
        )
        if turn % 3 == 0:
            upstream.script(
                Step(text="Let me read it.", tool_calls=((f"toolu_{turn}", "read_file", "{}"),))
            )
            reply = client.messages.create(
                model="claude-3-5-sonnet-latest",
                max_tokens=200,
                system=system,
                tools=tools,
                messages=history,
            )
            history.append(
                {"role": "assistant", "content": [b.model_dump() for b in reply.content]}
            )
            history.append(
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": f"toolu_{turn}",
                            "content": _tool_output(turn),
                        }
                    ],
                }
            )
        raw = client.messages.with_raw_response.create(
            model="claude-3-5-sonnet-latest",
            max_tokens=200,
            system=system,
            tools=tools,
            messages=history,
        )
        body = upstream.requests[-1].body
        assert body["messages"][-1] == history[-1]
        assert int(raw.headers["X-Ledger-Context-Tokens"]) <= 0.95 * WINDOW
        if turn == 0:
            _small_window("stable-anthropic")
        if fitted_at is None and raw.headers["X-Ledger-Compacted"] == "true":
            fitted_at = len(upstream.requests) - 1
        if fitted_at is not None and restarted_at is None and turn > 60:
            # A restart of the gateway's workers: everything fitting needs is in the database.
            after.wait_idle()
            workers.restart()
            connections.close_all()
            restarted_at = len(upstream.requests)
        history.append(
            {"role": "assistant", "content": [b.model_dump() for b in raw.parse().content]}
        )
    after.wait_idle()
    assert fitted_at is not None
    forwarded = upstream.requests
    stable, pairs = stable_share(forwarded, fitted_at)
    print(f"messages: {stable}/{pairs} forwarded requests prefix-stable")
    assert stable >= 0.9 * pairs
    if restarted_at is not None:
        # Stable across the restart, unless that very call compacted (a new summary).
        before, later = forwarded[restarted_at - 1], forwarded[restarted_at]
        assert prefix_stable(before, later) or before.body["system"] != later.body["system"]
    last = forwarded[-1].body
    # System blocks stay blocks, the client's markers stay on them, one marker ends the
    # summary, never more than four in all.
    assert last["system"][:2] == system
    assert last["system"][-1]["text"].startswith(shape.SUMMARY_HEADER)
    assert last["system"][-1]["cache_control"] == {"type": "ephemeral"}
    assert len(breakpoints._marked(last)) <= breakpoints.MAX_BREAKPOINTS


def test_it_keeps_at_most_four_breakpoints_dropping_the_oldest():
    def marked(text: str) -> dict:
        return {"type": "text", "text": text, "cache_control": {"type": "ephemeral"}}

    body = {
        "tools": [{"name": "t", "input_schema": {}, "cache_control": {"type": "ephemeral"}}],
        "system": [marked("a"), marked("b")],
        "messages": [{"role": "user", "content": [marked("c"), marked("d")]}],
        "cache_control": {"type": "ephemeral"},
    }
    capped = breakpoints.cap_breakpoints(body)
    assert "cache_control" not in capped["tools"][0]
    assert [b.get("cache_control") is not None for b in capped["system"]] == [True, True]
    assert len(breakpoints._marked(capped)) == breakpoints.MAX_BREAKPOINTS
    # Top-level automatic caching passes through; the client's body is not touched.
    assert capped["cache_control"] == {"type": "ephemeral"}
    assert "cache_control" in body["tools"][0]
