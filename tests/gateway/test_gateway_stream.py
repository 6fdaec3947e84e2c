"""Streaming through the gateway: chunks are relayed as they arrive, the reply is recorded at
the end, a client that leaves leaves an incomplete reply, an upstream failure mid-stream
arrives as the provider's error event."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from compaction_app.testkit.provider_standin import Step
from sessions_app.models import Event, Session
from tests.support.gateway_live import anthropic_client, openai_client, token_for, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

TEXT = "one two three four five six"


def replies(client_key: str) -> list[Event]:
    session = Session.objects.filter(client_key=client_key).first()
    if session is None:
        return []
    return list(Event.objects.filter(session=session, type="AGENT_MESSAGE").order_by("seq"))


def test_it_relays_openai_chunks_before_the_upstream_finishes(gateway_url, upstream, alice):
    # 8 chunks, 0.3 s apart: the whole stream takes over 2 s upstream.
    upstream.script(Step(text=TEXT, pause=0.3, prompt_tokens=40))
    client = openai_client(gateway_url, key=token_for(alice), session="stream-1")
    started = time.monotonic()
    stream = client.chat.completions.create(
        model="gpt-4o",
        messages=[{"role": "user", "content": "Count"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces = []
    first_at = None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            first_at = first_at or time.monotonic() - started
            pieces.append(chunk.choices[0].delta.content)
    total = time.monotonic() - started
    assert "".join(pieces) == TEXT
    assert first_at is not None and first_at < total - 1.0
    (reply,) = wait_until(lambda: replies("stream-1"))
    assert reply.content == TEXT
    assert reply.prompt_tokens == 40
    assert "incomplete" not in reply.metadata


def test_it_relays_anthropic_events_and_records_the_reply(gateway_url, upstream, alice):
    upstream.script(Step(text=TEXT, pause=0.05, tool_calls=(("toolu_9", "grep", '{"q": "x"}'),)))
    client = anthropic_client(gateway_url, key=token_for(alice), session="stream-2")
    with client.messages.stream(
        model="claude-3.5-sonnet", max_tokens=100, messages=[{"role": "user", "content": "Go"}]
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == TEXT
    assert final.content[1].type == "tool_use"
    session = Session.objects.get(client_key="stream-2")
    stored = wait_until(
        lambda: list(Event.objects.filter(session=session, type__in=["AGENT_MESSAGE", "TOOL_CALL"]))
    )
    wait_until(lambda: Event.objects.filter(session=session, type="TOOL_CALL").exists())
    stored = list(Event.objects.filter(session=session).order_by("seq"))
    assert [e.type for e in stored] == ["USER_MESSAGE", "AGENT_MESSAGE", "TOOL_CALL"]
    assert stored[1].content == TEXT
    assert json.loads(stored[2].content) == {"q": "x"}


def test_it_marks_the_reply_incomplete_when_the_client_leaves(gateway_url, upstream, alice):
    upstream.script(Step(text=TEXT, pause=0.4))
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "Count"}], "stream": True}
    headers = {"X-Ledger-Key": token_for(alice), "X-Ledger-Session": "leaver"}
    with (
        httpx.Client(timeout=10) as http,
        http.stream(
            "POST", f"{gateway_url}/gateway/openai/v1/chat/completions", json=body, headers=headers
        ) as response,
    ):
        assert response.status_code == 200
        seen = b""
        for chunk in response.iter_raw():
            seen += chunk
            if seen.count(b"data:") >= 3:
                break  # leave mid-stream: the connection closes here
    (reply,) = wait_until(lambda: replies("leaver"), timeout=15)
    assert reply.metadata["incomplete"] is True
    assert TEXT.startswith(reply.content)
    assert reply.content != TEXT


@pytest.mark.parametrize("kind", ["stream_error", "break"])
def test_it_relays_an_upstream_failure_mid_stream_as_openais_error_event(
    gateway_url, upstream, alice, kind
):
    import openai

    upstream.script(Step(kind=kind, text=TEXT, chunks_before_break=3))
    client = openai_client(gateway_url, key=token_for(alice), session=f"broken-{kind}")
    stream = client.chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "Count"}], stream=True
    )
    with pytest.raises(openai.APIError):
        for _ in stream:
            pass
    (reply,) = wait_until(lambda: replies(f"broken-{kind}"))
    assert reply.metadata["incomplete"] is True


def test_it_relays_an_upstream_failure_mid_stream_as_anthropics_error_event(
    gateway_url, upstream, alice
):
    import anthropic

    upstream.script(Step(kind="break", text=TEXT, chunks_before_break=4))
    client = anthropic_client(gateway_url, key=token_for(alice), session="broken-claude")
    with (
        pytest.raises(anthropic.APIStatusError),
        client.messages.stream(
            model="claude-3.5-sonnet", max_tokens=100, messages=[{"role": "user", "content": "Go"}]
        ) as stream,
    ):
        for _ in stream.text_stream:
            pass
    (reply,) = wait_until(lambda: replies("broken-claude"))
    assert reply.metadata["incomplete"] is True
