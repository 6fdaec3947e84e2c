"""The gateway's Anthropic Messages endpoints, driven by the official `anthropic` SDK against
daphne serving the app, forwarding to the provider stand-in."""

from __future__ import annotations

import json

import anthropic
import httpx
import pytest

from compaction_app.testkit.provider_standin import Step
from sessions_app.models import Event, Session
from tests.support.gateway_live import CANARY, anthropic_client, token_for

pytestmark = pytest.mark.django_db(transaction=True)

SYSTEM = "You are a terse coding agent."


def events_of(session: Session) -> list[Event]:
    return list(Event.objects.filter(session=session).order_by("seq"))


def test_it_records_system_tool_use_and_tool_result(gateway_url, upstream, alice):
    client = anthropic_client(gateway_url, key=token_for(alice), session="claude-thread")
    upstream.script(
        Step(text="Reading it.", tool_calls=(("toolu_1", "read_file", '{"path": "a.py"}'),))
    )
    history: list[dict] = [{"role": "user", "content": "Read a.py"}]
    raw = client.messages.with_raw_response.create(
        model="claude-3.5-sonnet", max_tokens=200, system=SYSTEM, messages=history
    )
    first = raw.parse()
    assert first.content[1].type == "tool_use"
    session = Session.objects.get(client_key="claude-thread")
    assert raw.headers["X-Ledger-Session"] == str(session.pk)
    assert raw.headers["X-Ledger-Model"] == "claude-3.5-sonnet"
    sent = upstream.requests[-1]
    # This SDK version sends its key as a bearer token; either way it is forwarded as sent.
    assert CANARY in (sent.headers.get("x-api-key"), sent.headers.get("authorization", "")[7:])
    assert sent.body["system"] == SYSTEM
    assert sent.body["max_tokens"] == 200

    history += [
        {"role": "assistant", "content": [block.model_dump() for block in first.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "print(1)"}],
        },
    ]
    client.messages.create(
        model="claude-3.5-sonnet", max_tokens=200, system=SYSTEM, messages=history
    )
    stored = events_of(session)
    assert [e.type for e in stored] == [
        "SYSTEM_PROMPT",
        "USER_MESSAGE",
        "AGENT_MESSAGE",
        "TOOL_CALL",
        "TOOL_RESULT",
        "AGENT_MESSAGE",
    ]
    assert json.loads(stored[3].content) == {"path": "a.py"}
    assert stored[4].tool_call_id == "toolu_1"
    assert stored[2].metadata["model"] == "claude-3.5-sonnet"


def test_it_maps_anthropic_usage_with_cache_tokens(gateway_url, upstream, alice):
    upstream.script(Step(text="ok", prompt_tokens=900, cache_read_tokens=600))
    client = anthropic_client(gateway_url, key=token_for(alice), session="cache")
    client.messages.create(
        model="claude-3.5-sonnet",
        max_tokens=50,
        system=[{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}],
        messages=[{"role": "user", "content": "Hi"}],
    )
    reply = events_of(Session.objects.get(client_key="cache"))[-1]
    # input 300 + cache read 600 = everything the model read.
    assert reply.prompt_tokens == 900
    assert reply.completion_tokens == 1
    assert reply.total_tokens == 901
    assert reply.metadata["usage"]["cache_read_input_tokens"] == 600
    # cache_control is a field the gateway does not know: it reached the upstream unchanged.
    assert upstream.requests[-1].body["system"][0]["cache_control"] == {"type": "ephemeral"}


def test_it_counts_tokens_with_the_ledgers_counter(gateway_url, alice):
    client = anthropic_client(gateway_url, key=token_for(alice), session=None)
    counted = client.messages.count_tokens(
        model="claude-3.5-sonnet", system=SYSTEM, messages=[{"role": "user", "content": "Hello"}]
    )
    from sessions_app import tokens

    counter = tokens.counter_for_model("claude-3.5-sonnet")
    expected = tokens.context_tokens(
        [
            tokens.message_tokens(counter, role="system", content=SYSTEM),
            tokens.message_tokens(counter, role="user", content="Hello"),
        ]
    )
    assert counted.input_tokens == expected
    with pytest.raises(anthropic.AuthenticationError):
        anthropic_client(gateway_url, key="wrong", session=None).messages.count_tokens(
            model="claude-3.5-sonnet", messages=[{"role": "user", "content": "Hello"}]
        )


def test_it_refuses_a_missing_key_in_anthropics_shape(gateway_url, upstream, alice):
    client = anthropic_client(gateway_url, key=None, session="t")
    with pytest.raises(anthropic.AuthenticationError) as caught:
        client.messages.create(
            model="claude-3.5-sonnet", max_tokens=5, messages=[{"role": "user", "content": "x"}]
        )
    assert caught.value.body["type"] == "error"
    assert caught.value.body["error"]["type"] == "authentication_error"
    assert upstream.requests == []


@pytest.mark.parametrize(
    "body",
    [
        {"model": "claude-3.5-sonnet", "max_tokens": 5, "messages": {"role": "user"}},
        {
            "model": "claude-3.5-sonnet",
            "max_tokens": 5,
            "messages": [{"role": "system", "content": "x"}],
        },
        {
            "model": "claude-3.5-sonnet",
            "max_tokens": 5,
            "messages": [{"role": "user", "content": 3}],
        },
        {
            "model": "claude-3.5-sonnet",
            "max_tokens": 5,
            "system": 7,
            "messages": [{"role": "user", "content": "x"}],
        },
        {
            "model": "claude-3.5-sonnet",
            "max_tokens": 5,
            "messages": [{"role": "user", "content": [{"type": "tool_result"}]}],
        },
    ],
)
def test_it_answers_bad_input_in_anthropics_shape(gateway_url, upstream, alice, body):
    response = httpx.post(
        f"{gateway_url}/gateway/anthropic/v1/messages",
        json=body,
        headers={"X-Ledger-Key": token_for(alice), "X-Ledger-Session": "bad"},
    )
    assert response.status_code == 400, response.text
    assert response.json()["type"] == "error"
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert upstream.requests == []
    assert not Event.objects.exists()


def test_it_answers_malformed_json_in_anthropics_shape(gateway_url, alice):
    response = httpx.post(
        f"{gateway_url}/gateway/anthropic/v1/messages",
        content=b"{nope",
        headers={"X-Ledger-Key": token_for(alice), "X-Ledger-Session": "bad"},
    )
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"
