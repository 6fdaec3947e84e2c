"""The gateway as a proxy first: one wire contract for its three formats, endpoints and
content it has no rule for passed through, its own errors in the provider's JSON shape on
every path under /gateway/ (HEAD and unknown paths included), and a hard-limit compaction
kept off the short hops' database threads."""

from __future__ import annotations

import json
import threading

import anthropic as anthropic_sdk
import httpx
import pytest

from compaction_app.gateway import prepare, views, wire
from compaction_app.gateway.providers import PROVIDERS, gemini
from compaction_app.gateway.providers import anthropic_messages as anthropic
from compaction_app.gateway.providers import openai_chat as openai
from compaction_app.gateway.providers import openai_responses as responses
from compaction_app.models import CompactionRun
from sessions_app.models import Event, Session
from sessions_app.services import session_update
from tests.support.gateway_live import CANARY, anthropic_client, openai_client, token_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("module", [openai, responses, anthropic, gemini])
def test_it_builds_every_wire_format_on_the_one_contract(module):
    assert module in PROVIDERS and views.WIRES == PROVIDERS
    members = set(wire.Wire.__annotations__) | {
        name for name in vars(wire.Wire) if not name.startswith("_")
    }
    assert "parse_request" in members and "UPSTREAM_SETTING" in members
    for name in members:
        assert hasattr(module, name), name
    assert all(route.kind in views._KINDS for route in module.ROUTES)


@pytest.mark.parametrize(
    ("path", "shape"),
    [
        ("/gateway/nowhere", "openai"),
        ("/gateway/", "openai"),
        ("/gateway/anthropic/", "anthropic"),
        ("/gateway/openai/v1", "openai"),
    ],
)
def test_it_answers_unknown_paths_in_the_providers_json_shape(gateway_url, path, shape):
    response = httpx.get(f"{gateway_url}{path}")
    assert response.status_code == 404
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    if shape == "anthropic":
        assert body["type"] == "error" and body["error"]["type"] == "not_found_error"
    else:
        assert body["error"]["type"] == "not_found_error"


@pytest.mark.parametrize("path", ["/gateway/anthropic", "/gateway/openai/v1"])
def test_it_answers_the_head_probe_of_a_base_url(gateway_url, upstream, path):
    response = httpx.head(f"{gateway_url}{path}")
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"  # never the site's HTML
    assert upstream.requests == []


def test_it_answers_a_wrong_method_in_the_providers_shape(gateway_url):
    response = httpx.get(f"{gateway_url}/gateway/anthropic/v1/messages")
    assert response.status_code == 405
    assert response.json()["type"] == "error"
    assert response.headers["allow"] == "POST"


def test_it_passes_endpoints_it_has_no_rule_for_through(gateway_url, upstream, alice):
    response = httpx.post(
        f"{gateway_url}/gateway/anthropic/v1/messages/batches?beta=true",
        json={"requests": []},
        headers={"X-Ledger-Key": token_for(alice), "x-api-key": CANARY},
    )
    # The stand-in has no such route: its own 404 comes back, not the gateway's.
    assert response.status_code == 404
    assert response.json() == {"error": {"message": "no such route"}}
    sent = upstream.requests[-1]
    assert (sent.method, sent.path, sent.body) == ("POST", "/v1/messages/batches", {"requests": []})
    assert sent.headers["x-api-key"] == CANARY
    assert not any(name.startswith("x-ledger") for name in sent.headers)
    # Without the ledger's key nothing is forwarded.
    refused = httpx.get(f"{gateway_url}/gateway/openai/v1/files")
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
    assert len(upstream.requests) == 1


def test_it_forwards_a_mid_conversation_system_message_and_unknown_blocks(
    gateway_url, upstream, alice
):
    """Claude Code's shape: a system message after the first turn (beta header
    `mid-conversation-system-*`), thinking with its signature, a server tool's blocks."""
    client = anthropic_client(gateway_url, key=token_for(alice), session="proxy-first")
    thinking = {"type": "thinking", "thinking": "let me see", "signature": "sig-abc"}
    server_use = {"type": "server_tool_use", "id": "srv_1", "name": "web_search", "input": {}}
    server_result = {"type": "web_search_tool_result", "tool_use_id": "srv_1", "content": []}
    messages = [
        {"role": "user", "content": "Find it."},
        {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
        {"role": "assistant", "content": [thinking, server_use, server_result]},
        {"role": "user", "content": [{"type": "document", "source": {"type": "text"}}]},
    ]
    client.messages.create(
        model="claude-3.5-sonnet",
        max_tokens=10,
        system=[{"type": "text", "text": "Sys", "cache_control": {"type": "ephemeral"}}],
        messages=messages,
        extra_headers={"anthropic-beta": "mid-conversation-system-2026-04-07"},
        extra_body={"context_management": {"edits": []}},
    )
    sent = upstream.requests[-1]
    assert sent.body["messages"] == messages
    assert sent.body["system"][0]["cache_control"] == {"type": "ephemeral"}
    assert sent.body["context_management"] == {"edits": []}
    assert sent.headers["anthropic-beta"] == "mid-conversation-system-2026-04-07"
    stored = list(Event.objects.filter(session__client_key="proxy-first").order_by("seq"))
    assert [e.type for e in stored] == [
        "SYSTEM_PROMPT",
        "USER_MESSAGE",
        "SYSTEM_PROMPT",
        "AGENT_MESSAGE",
        "USER_MESSAGE",
        "AGENT_MESSAGE",
    ]
    assert stored[2].content == "Be brief."
    assert json.loads(stored[3].content) == [thinking, server_use, server_result]
    assert json.loads(stored[4].content)[0]["type"] == "document"


def test_it_rebuilds_thinking_and_server_blocks_from_a_stream():
    events = [
        {"type": "message_start", "message": {"model": "claude-x", "usage": {"input_tokens": 3}}},
        {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "thinking", "thinking": "", "signature": ""},
        },
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "thinking_delta", "thinking": "hm"},
        },
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "signature_delta", "signature": "s1"},
        },
        {
            "type": "content_block_start",
            "index": 1,
            "content_block": {"type": "redacted_thinking", "data": "opaque"},
        },
        {
            "type": "content_block_start",
            "index": 2,
            "content_block": {"type": "text", "text": ""},
        },
        {"type": "content_block_delta", "index": 2, "delta": {"type": "text_delta", "text": "ok"}},
        {"type": "message_delta", "delta": {}, "usage": {"output_tokens": 2}},
        {"type": "message_stop"},
    ]
    accumulator = anthropic.stream_accumulator("claude-x")
    for event in events:
        accumulator.feed(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode())
    reply = accumulator.reply()
    assert accumulator.done and reply is not None
    assert reply.message.drafts[0].content == [
        {"type": "thinking", "thinking": "hm", "signature": "s1"},
        {"type": "redacted_thinking", "data": "opaque"},
        {"type": "text", "text": "ok"},
    ]
    # Reasoning is kept out of the message's identity: a client that drops it from an
    # earlier turn still resends the same message.
    resent = anthropic.to_client_message(
        {"role": "assistant", "content": [{"type": "text", "text": "ok"}]}
    )
    assert resent.hash == reply.message.hash


def test_it_refuses_a_conversation_that_opens_with_a_system_message():
    with pytest.raises(Exception, match="messages.0.role"):
        anthropic.parse_request({"model": "m", "messages": [{"role": "system", "content": "x"}]})


@pytest.mark.parametrize(
    ("session_key", "fill"),
    [
        ("long-hop", 0.97),  # the hard limit (0.95)
        # Between the compact threshold (0.8) and the hard limit: cache-stable fitting
        # compacts once there, and a remote summarizer can take its whole timeout too.
        ("crossing-hop", 0.87),
    ],
)
def test_it_compacts_off_the_short_hop_threads(
    gateway_url, upstream, alice, monkeypatch, session_key, fill
):
    seen: list[str] = []
    original = prepare.fit

    def watched(**kwargs):
        seen.append(threading.current_thread().name)
        return original(**kwargs)

    monkeypatch.setattr(prepare, "fit", watched)
    client = openai_client(gateway_url, key=token_for(alice), session=session_key)
    history = [{"role": "system", "content": "You are a coding agent."}]
    for turn in range(6):
        history.append({"role": "user", "content": f"Look at module {turn} and fix it. " * 12})
        reply = client.chat.completions.create(model="gpt-4o", messages=history)
        history.append({"role": "assistant", "content": reply.choices[0].message.content})
    assert all(name.startswith("gateway-db") for name in seen)  # cheap fits: the same hop
    session = session_update(
        session=Session.objects.get(client_key=session_key),
        settings={"autoCompact": False, "keepRecentEvents": 1},
    )
    session_update(session=session, context_limit=int((session.context_tokens + 12) / fill))
    history.append({"role": "user", "content": "Status?"})
    seen.clear()
    raw = client.chat.completions.with_raw_response.create(model="gpt-4o", messages=history)
    assert raw.headers["X-Ledger-Compacted"] == "true"
    assert CompactionRun.objects.get(session=session).status == "completed"
    assert seen and all(name.startswith("gateway-long") for name in seen)


def test_it_raises_the_sdks_own_error_classes_on_gateway_errors(gateway_url, upstream):
    client = anthropic_client(gateway_url, key="not-a-key", session="x")
    with pytest.raises(anthropic_sdk.AuthenticationError):
        client.messages.create(
            model="claude-3.5-sonnet", max_tokens=5, messages=[{"role": "user", "content": "x"}]
        )
