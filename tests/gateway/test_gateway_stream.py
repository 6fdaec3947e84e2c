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


# --- any event shape: the stream ends with the provider's error event (issue 42, row 1) -----

_GOOD_OPENAI = (
    b'data: {"id": "c1", "object": "chat.completion.chunk", "model": "gpt-4o", "choices": '
    b'[{"index": 0, "delta": {"role": "assistant", "content": "Hel"}}]}\n\n'
)
_GOOD_ANTHROPIC = (
    b'event: message_start\ndata: {"type": "message_start", "message": {"id": "m", "type": '
    b'"message", "role": "assistant", "model": "claude-3-5-sonnet-20241022", "content": [], '
    b'"usage": {"input_tokens": 5, "output_tokens": 1}}}\n\n'
    b'event: content_block_start\ndata: {"type": "content_block_start", "index": 0, '
    b'"content_block": {"type": "text", "text": ""}}\n\n'
    b'event: content_block_delta\ndata: {"type": "content_block_delta", "index": 0, '
    b'"delta": {"type": "text_delta", "text": "Hel"}}\n\n'
)
_GOOD_GEMINI = (
    b'data: {"candidates": [{"content": {"role": "model", "parts": [{"text": "Hel"}]}, '
    b'"index": 0}], "modelVersion": "gemini-2.5-pro"}\r\n\r\n'
)
_GOOD_RESPONSES = (
    b'event: response.output_item.added\ndata: {"type": "response.output_item.added", '
    b'"output_index": 0, "item": {"type": "message", "role": "assistant", "content": []}}\n\n'
    b'event: response.output_text.delta\ndata: {"type": "response.output_text.delta", '
    b'"output_index": 0, "content_index": 0, "delta": "Hel"}\n\n'
)

_SHAPES = [
    ("chat", _GOOD_OPENAI, b'data: {"choices": 5}\n\n', b"data: [DONE]\n\n"),
    ("chat", _GOOD_OPENAI, b'data: {"choices": [{"delta": 5}]}\n\n', b"data: [DONE]\n\n"),
    (
        "chat",
        _GOOD_OPENAI,
        b'data: {"choices": [{"delta": {"tool_calls": [{"index": "x"}]}}]}\n\n',
        b"data: [DONE]\n\n",
    ),
    (
        "anthropic",
        b"",
        b'event: message_start\ndata: {"type": "message_start", "message": 5}\n\n',
        b'event: message_stop\ndata: {"type": "message_stop"}\n\n',
    ),
    (
        "anthropic",
        _GOOD_ANTHROPIC,
        b'event: content_block_start\ndata: {"type": "content_block_start", "index": 1, '
        b'"content_block": 5}\n\n',
        b'event: message_stop\ndata: {"type": "message_stop"}\n\n',
    ),
    (
        "gemini",
        _GOOD_GEMINI,
        b'data: {"candidates": [{"content": {"role": "model", "parts": 5}}]}\r\n\r\n',
        b'data: {"candidates": [{"content": {"parts": [{"text": "!"}]}, "finishReason": '
        b'"STOP"}]}\r\n\r\n',
    ),
    (
        "responses",
        _GOOD_RESPONSES,
        b'event: response.output_item.done\ndata: {"type": "response.output_item.done", '
        b'"output_index": 1, "item": 5}\n\n',
        b'event: response.completed\ndata: {"type": "response.completed", "response": '
        b'{"output": []}}\n\n',
    ),
]


def _stream_request(wire: str) -> tuple[str, dict]:
    if wire == "anthropic":
        return "/gateway/anthropic/v1/messages", {
            "model": "claude-3-5-sonnet-20241022",
            "max_tokens": 50,
            "stream": True,
            "messages": [{"role": "user", "content": "Go"}],
        }
    if wire == "gemini":
        return "/gateway/gemini/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse", {
            "contents": [{"role": "user", "parts": [{"text": "Go"}]}]
        }
    if wire == "responses":
        return "/gateway/openai/v1/responses", {"model": "gpt-4o", "input": "Go", "stream": True}
    return "/gateway/openai/v1/chat/completions", {
        "model": "gpt-4o",
        "stream": True,
        "messages": [{"role": "user", "content": "Go"}],
    }


def _error_event(wire: str, data: bytes) -> dict:
    events = [
        json.loads(line[5:])
        for line in data.replace(b"\r\n", b"\n").split(b"\n")
        if line.startswith(b"data:") and line[5:].strip() != b"[DONE]"
    ]
    last = events[-1]
    if wire == "anthropic":
        assert last["type"] == "error" and last["error"]["type"] == "api_error"
    elif wire == "responses":
        assert last["type"] == "error"
    else:
        assert "error" in last
    return last


@pytest.mark.parametrize(("wire", "good", "bad", "after"), _SHAPES)
def test_it_ends_the_clients_stream_with_the_providers_error_event_on_any_event_shape(
    gateway_url, upstream, alice, wire, good, bad, after
):
    """Issue 42, row 1: a 200 `text/event-stream` with one well-formed but wrongly shaped event
    (`{"choices":5}`, `{"choices":[{"delta":5}]}`, Anthropic `message_start` with `"message":5`,
    Gemini `parts: 5`) raised a TypeError in the wire's reader: the client got no end (daphne
    sent nothing for 40 s), the reply was not recorded, the call said `client_disconnected`.
    Now what came before the event is relayed, the stream ends with the provider's own error
    event, what was read is recorded (incomplete), and the call's row says what happened."""
    from sessions_app.models import Call

    upstream.script(Step(kind="raw_stream", raw_body=good + bad + after))
    path, body = _stream_request(wire)
    key = f"odd-stream-{wire}"
    headers = {
        "Authorization": "Bearer sk-x",
        "x-api-key": "sk-x",
        "x-goog-api-key": "sk-x",
        "anthropic-version": "2023-06-01",
        "X-Ledger-Key": token_for(alice),
        "X-Ledger-Session": key,
    }
    started = time.monotonic()
    with httpx.stream(
        "POST", gateway_url + path, json=body, headers=headers, timeout=10
    ) as response:
        assert response.status_code == 200
        data = b"".join(response.iter_raw())
    assert time.monotonic() - started < 5
    assert data.startswith(good)  # relayed as it came
    assert bad not in data and after not in data  # nothing after the event it could not read
    error = _error_event(wire, data)
    assert "could not read" in json.dumps(error)
    session = Session.objects.get(client_key=key)
    call = wait_until(lambda: Call.objects.filter(session=session).first())
    assert call.status == "provider_error", call.status
    assert call.error_code == "malformed_event" and call.http_status == 200
    if good:
        (reply,) = wait_until(lambda: replies(key))
        assert "Hel" in json.dumps(reply.content)
        assert reply.metadata.get("incomplete") is True
