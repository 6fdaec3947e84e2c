"""The API body limit on the ASGI path the servers use: chunked bodies (no Content-Length)
are read, held to API_MAX_BODY_BYTES while they stream in, and oversize ones get 413."""

from __future__ import annotations

import asyncio
import json

import pytest
from asgiref.sync import async_to_sync

from sessions_app.models import Event, Session
from tests.support.helpers import api_token, asgi_answer, asgi_http_scope, create_session

pytestmark = pytest.mark.django_db(transaction=True)


def asgi_request(
    method: str, path: str, chunks: list[bytes], *, headers: list[tuple[bytes, bytes]]
) -> tuple[int, dict, int]:
    """Drive config.asgi.application as an ASGI server does for a chunked request: the body
    arrives in several http.request messages. Returns (status, JSON body, messages read)."""
    from config.asgi import application

    scope = asgi_http_scope(method, path, headers)
    messages = [
        {"type": "http.request", "body": chunk, "more_body": index < len(chunks) - 1}
        for index, chunk in enumerate(chunks)
    ]
    read = 0
    sent: list[dict] = []

    async def receive() -> dict:
        nonlocal read
        if read < len(messages):
            read += 1
            return messages[read - 1]
        # A client that stays connected after sending its body.
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async def send(message: dict) -> None:
        sent.append(message)

    async_to_sync(application)(scope, receive, send)
    status, body = asgi_answer(sent)
    return status, json.loads(body), read


def chunked(payload: object, size: int) -> list[bytes]:
    raw = json.dumps(payload).encode()
    return [raw[i : i + size] for i in range(0, len(raw), size)]


def auth_headers(user) -> list[tuple[bytes, bytes]]:
    return [
        (b"authorization", f"Token {api_token(user)}".encode()),
        (b"content-type", b"application/json"),
        (b"transfer-encoding", b"chunked"),
    ]


def test_it_reads_a_chunked_body_without_content_length(alice, alice_api):
    session_id = create_session(alice_api)
    payload = [{"type": "USER_MESSAGE", "content": f"chunked message {i}"} for i in range(20)]
    status, body, _ = asgi_request(
        "POST",
        f"/api/v1/sessions/{session_id}/events",
        chunked(payload, 100),
        headers=auth_headers(alice),
    )
    assert status == 201, body
    assert [event["content"] for event in body] == [item["content"] for item in payload]
    assert Event.objects.filter(session_id=session_id).count() == 21


def test_it_refuses_an_oversize_chunked_body_while_it_streams(alice, alice_api, settings):
    settings.API_MAX_BODY_BYTES = 2048
    session_id = create_session(alice_api)
    before = Session.objects.filter(pk=session_id).values().get()
    chunks = chunked({"type": "USER_MESSAGE", "content": "x" * 10_000}, 512)
    status, body, read = asgi_request(
        "POST", f"/api/v1/sessions/{session_id}/events", chunks, headers=auth_headers(alice)
    )
    assert status == 413
    assert body["error"] == "request_too_large"
    assert body["limit"] == 2048
    assert body["detail"]
    # Refused as soon as the limit was passed, not after the whole body.
    assert read == 5 < len(chunks)
    assert Session.objects.filter(pk=session_id).values().get() == before
    assert Event.objects.filter(session_id=session_id).count() == 1


def test_it_refuses_an_oversize_chunked_session_create(alice, settings):
    settings.API_MAX_BODY_BYTES = 1024
    chunks = chunked({"model": "gpt-4o", "systemPrompt": "y" * 4000}, 256)
    status, body, _ = asgi_request("POST", "/api/v1/sessions", chunks, headers=auth_headers(alice))
    assert (status, body["error"]) == (413, "request_too_large")
    assert not Session.objects.exists()


def test_it_refuses_a_declared_oversize_body_before_reading_it(alice, alice_api, settings):
    settings.API_MAX_BODY_BYTES = 2048
    session_id = create_session(alice_api)
    chunks = chunked({"type": "USER_MESSAGE", "content": "x" * 10_000}, 512)
    headers = [
        (b"authorization", f"Token {api_token(alice)}".encode()),
        (b"content-type", b"application/json"),
        (b"content-length", str(sum(map(len, chunks))).encode()),
    ]
    status, body, read = asgi_request(
        "POST", f"/api/v1/sessions/{session_id}/events", chunks, headers=headers
    )
    assert (status, body["error"], read) == (413, "request_too_large", 0)
    assert Event.objects.filter(session_id=session_id).count() == 1


def test_it_counts_tokens_of_a_chunked_token_count_body(alice, alice_api):
    payload = {"model": "gpt-4o", "text": "hello world " * 50}
    status, body, _ = asgi_request(
        "POST", "/api/v1/tokens/count", chunked(payload, 64), headers=auth_headers(alice)
    )
    assert status == 200, body
    assert body == alice_api.post("/api/v1/tokens/count", payload, format="json").json()


# --- through a real daphne server --------------------------------------------------------------


@pytest.fixture
def daphne_url(transactional_db):
    """A daphne process serving config.asgi on the test database (the test's committed rows
    are visible to it). The body limit is 4096 bytes there."""
    import os

    from django.db import connection

    from tests.support.daphne import daphne_process

    db = connection.settings_dict
    if connection.vendor == "postgresql":
        url = f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
    else:
        url = f"sqlite:///{db['NAME']}"
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "DJANGO_SECRET_KEY": os.environ.get("DJANGO_SECRET_KEY") or "test-only",
        "API_MAX_BODY_BYTES": "4096",
    }
    with daphne_process(env) as port:
        yield f"127.0.0.1:{port}"


def post_chunked(address: str, path: str, token: str, chunks: list[bytes]) -> tuple[int, dict]:
    """POST with Transfer-Encoding: chunked (http.client sends no Content-Length then)."""
    import http.client

    connection = http.client.HTTPConnection(address, timeout=30)
    try:
        connection.request(
            "POST",
            path,
            body=iter(chunks),
            headers={"Authorization": f"Token {token}", "Content-Type": "application/json"},
            encode_chunked=True,
        )
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def test_it_takes_and_limits_chunked_bodies_through_daphne(alice, alice_api, daphne_url):
    session_id = create_session(alice_api)
    token = api_token(alice)
    path = f"/api/v1/sessions/{session_id}/events"
    payload = [{"type": "USER_MESSAGE", "content": f"over the wire {i}"} for i in range(10)]
    status, body = post_chunked(daphne_url, path, token, chunked(payload, 50))
    assert status == 201, body
    assert [event["seq"] for event in body] == list(range(2, 12))

    before = Session.objects.filter(pk=session_id).values().get()
    status, body = post_chunked(
        daphne_url, path, token, chunked({"type": "USER_MESSAGE", "content": "x" * 20_000}, 1000)
    )
    assert (status, body["error"], body["limit"]) == (413, "request_too_large", 4096)
    assert Session.objects.filter(pk=session_id).values().get() == before
    assert Event.objects.filter(session_id=session_id).count() == 11
