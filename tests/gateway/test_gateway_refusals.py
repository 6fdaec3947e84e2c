"""What the gateway refuses before it records or forwards anything: a caller without a valid
key (before the body is even parsed), non-standard JSON, and headers with control characters
or broken UTF-8. Every refusal is in the provider's error shape; a UTF-8 session key is
stored exactly as sent. Raw HTTP (http.client) here: the SDKs' clients refuse to send such
headers at all, and an attacker does not use them."""

from __future__ import annotations

import http.client
import json
from typing import Any
from urllib.parse import urlsplit

import pytest

from sessions_app.models import Event, Session
from tests.support.gateway_live import CANARY, openai_client, token_for

pytestmark = pytest.mark.django_db(transaction=True)

CHAT = "/gateway/openai/v1/chat/completions"
MESSAGES = "/gateway/anthropic/v1/messages"


def _post(
    base: str, path: str, body: bytes, headers: list[tuple[str, bytes | str]]
) -> tuple[int, Any]:
    parts = urlsplit(base)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        connection.putrequest("POST", path, skip_accept_encoding=True)
        connection.putheader("Content-Type", "application/json")
        connection.putheader("Content-Length", str(len(body)))
        for name, value in headers:
            connection.putheader(name, value)
        connection.endheaders(body)
        response = connection.getresponse()
        data = response.read()
        return response.status, json.loads(data)
    finally:
        connection.close()


def _chat_body(**extra: Any) -> dict[str, Any]:
    return {"model": "gpt-4o", "messages": [{"role": "user", "content": "hello"}], **extra}


def _openai_error(body: Any) -> dict[str, Any]:
    assert set(body) == {"error"} and {"message", "type", "code"} <= set(body["error"]), body
    return body["error"]


def _anthropic_error(body: Any) -> dict[str, Any]:
    assert body["type"] == "error" and {"type", "message"} <= set(body["error"]), body
    return body["error"]


def _nothing_recorded() -> None:
    assert not Session.objects.exists() and not Event.objects.exists()


# --- authentication before the body ---------------------------------------------------------


@pytest.mark.parametrize("key", [None, "not-a-token"])
def test_it_authenticates_before_parsing_the_body(gateway_url, upstream, key):
    headers: list[tuple[str, bytes | str]] = [("X-Ledger-Session", "s")]
    if key is not None:
        headers.append(("X-Ledger-Key", key))
    status, body = _post(gateway_url, CHAT, b"{not json", headers)
    assert status == 401
    assert _openai_error(body)["code"] == "invalid_api_key"
    status, body = _post(gateway_url, MESSAGES, b'{"model": NaN', headers)
    assert status == 401
    assert _anthropic_error(body)["type"] == "authentication_error"
    assert upstream.requests == []


# --- non-standard JSON ----------------------------------------------------------------------


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_it_refuses_non_standard_json_numbers(gateway_url, upstream, alice, constant):
    key = token_for(alice)
    headers: list[tuple[str, bytes | str]] = [("X-Ledger-Key", key), ("X-Ledger-Session", "nan")]
    raw = json.dumps(_chat_body())[:-1] + f', "temperature": {constant}}}'
    status, body = _post(gateway_url, CHAT, raw.encode(), headers)
    assert status == 400
    assert _openai_error(body)["type"] == "invalid_request_error"
    claude = (
        '{"model": "claude-3.5-sonnet", "max_tokens": 5, "messages": '
        f'[{{"role": "user", "content": "hi"}}], "top_p": {constant}}}'
    )
    status, body = _post(gateway_url, MESSAGES, claude.encode(), headers)
    assert status == 400
    assert _anthropic_error(body)["type"] == "invalid_request_error"
    assert upstream.requests == []
    _nothing_recorded()


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_it_refuses_non_standard_json_numbers_on_the_rest_api(alice_api, constant):
    response = alice_api.generic(
        "POST",
        "/api/v1/sessions",
        f'{{"model": "gpt-4o", "contextLimit": {constant}}}',
        content_type="application/json",
    )
    assert response.status_code == 400 and "error" in response.json()
    assert not Session.objects.exists()


# --- headers --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("X-Ledger-Session", b"sess-\x01ctrl"),
        ("X-Ledger-Session", b"sess-\tTab"),
        ("X-Ledger-Thread", b"main\x7f"),
        ("X-Ledger-Fit", b"off\x1b"),
        ("X-Ledger-Session", "sess-été".encode("latin-1")),  # not UTF-8
    ],
)
def test_it_refuses_ledger_headers_with_control_characters_or_bad_utf8(
    gateway_url, upstream, alice, name, value
):
    headers: list[tuple[str, bytes | str]] = [("X-Ledger-Key", token_for(alice))]
    if name != "X-Ledger-Session":
        headers.append(("X-Ledger-Session", "fine"))
    headers.append((name, value))
    status, body = _post(gateway_url, CHAT, json.dumps(_chat_body()).encode(), headers)
    assert status == 400
    error = _openai_error(body)
    assert error["code"] == "invalid_header" and error["param"].lower() == name.lower()
    assert upstream.requests == []
    _nothing_recorded()


def test_it_stores_a_utf8_session_key_exactly(gateway_url, upstream, alice):
    key = token_for(alice)
    headers: list[tuple[str, bytes | str]] = [
        ("X-Ledger-Key", key),
        ("X-Ledger-Session", "sess-été-会话".encode()),
        ("Authorization", f"Bearer {CANARY}"),
    ]
    status, body = _post(gateway_url, CHAT, json.dumps(_chat_body()).encode(), headers)
    assert status == 200, body
    session = Session.objects.get(owner=alice)
    assert session.client_key == "sess-été-会话"
    # The same key through the official SDK reaches the same session.
    chat = openai_client(gateway_url, key=key, session=str(session.pk))
    chat.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "again"}])
    assert Session.objects.filter(owner=alice).count() == 1


@pytest.mark.parametrize(
    ("path", "name", "value"),
    [
        (CHAT, "X-Trace", b"a\x01b"),
        (CHAT, "Authorization", b"Bearer k\x7f"),
        (MESSAGES, "x-api-key", b"k\x1fey"),
        (MESSAGES, "anthropic-beta", b"tools\x1ax"),
    ],
)
def test_it_refuses_forwarded_headers_with_control_characters_before_recording(
    gateway_url, upstream, alice, path, name, value
):
    headers: list[tuple[str, bytes | str]] = [
        ("X-Ledger-Key", token_for(alice)),
        ("X-Ledger-Session", "forwarded"),
        (name, value),
    ]
    if path == CHAT:
        raw = json.dumps(_chat_body())
    else:
        raw = json.dumps(
            {
                "model": "claude-3.5-sonnet",
                "max_tokens": 5,
                "messages": [{"role": "user", "content": "hi"}],
            }
        )
    status, body = _post(gateway_url, path, raw.encode(), headers)
    assert status == 400
    error = _openai_error(body) if path == CHAT else _anthropic_error(body)
    assert "control character" in error["message"] and "\x7f" not in error["message"]
    assert upstream.requests == []
    _nothing_recorded()


@pytest.mark.django_db(transaction=True)
def test_it_names_the_sessions_limit_as_the_sessions_not_the_models_window(
    gateway_url, upstream, alice
):
    """A session limited to 2,000 tokens: a 6,000-token message is refused naming the limit as
    the session's, beside the model's own window (never "the context window of gpt-4o is
    2000")."""
    import openai

    from sessions_app.services import session_create

    session = session_create(owner=alice, model="gpt-4o", context_limit=2000)
    client = openai_client(gateway_url, key=token_for(alice), session=str(session.pk))
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "word " * 6000}]
        )
    message = refused.value.body["message"]  # type: ignore[index]
    assert refused.value.code == "context_length_exceeded"
    assert "2,000 tokens (the session's contextLimit; gpt-4o's own window is 128,000)" in message
    assert "context window of gpt-4o is 2000" not in message
    assert upstream.requests == []
