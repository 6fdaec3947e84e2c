"""Large events over the REST API (issue 22, row 14): a request holds at most a few times its
body on the path the servers use, and the append's answer leaves out a content it would
otherwise render twice more."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path

import pytest
from asgiref.sync import async_to_sync

from sessions_app import tokens
from sessions_app.api import parsers
from sessions_app.api.serializers import APPEND_ANSWER_MAX_CONTENT_CHARS
from sessions_app.models import Event
from tests.support.helpers import api_token, asgi_answer, asgi_http_scope, least_traced_peak

pytestmark = pytest.mark.django_db(transaction=True)

SESSIONS = "/api/v1/sessions"
# daphne hands a body to the application in messages of this size.
CHUNK = 8192


def prose(chars: int) -> str:
    """One long line of word-like text (what the tokenizer counts piece by piece)."""
    rng = random.Random(14)
    words = [
        "".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(2, 9))) for _ in range(3000)
    ]
    return " ".join(rng.choices(words, k=chars // 5))[:chars]


@pytest.fixture
def session(alice_api):
    response = alice_api.post(
        SESSIONS,
        {"model": "gpt-4o", "contextLimit": 100_000_000, "settings": {"autoCompact": False}},
        format="json",
    )
    assert response.status_code == 201, response.json()
    return response.json()["id"]


def post_asgi(path: str, body: bytes, *, token: str, chunked: bool = False) -> tuple[int, dict]:
    """POST through config.asgi.application as daphne does: the body in 8 KiB messages, sliced
    as they are read; with `chunked`, no Content-Length (Transfer-Encoding: chunked)."""
    from config.asgi import application

    framing = (
        [(b"transfer-encoding", b"chunked")]
        if chunked
        else [(b"content-length", str(len(body)).encode())]
    )
    scope = asgi_http_scope(
        "POST",
        path,
        [
            (b"authorization", f"Token {token}".encode()),
            (b"content-type", b"application/json"),
            *framing,
        ],
    )
    position = 0
    sent: list[dict] = []

    async def receive() -> dict:
        nonlocal position
        if position < len(body):
            chunk = body[position : position + CHUNK]
            position += CHUNK
            return {"type": "http.request", "body": chunk, "more_body": position < len(body)}
        await asyncio.Event().wait()  # a client that stays connected
        raise AssertionError("unreachable")

    async def send(message: dict) -> None:
        sent.append(message)

    async_to_sync(application)(scope, receive, send)
    status, answer = asgi_answer(sent)
    return status, json.loads(answer)


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_it_appends_an_8_mb_event_within_three_times_its_body(alice, session, chunked):
    token = api_token(alice)
    path = f"{SESSIONS}/{session}/events"
    # Everything loaded once per process (the vocabulary, the imports) is loaded before.
    assert post_asgi(path, b'{"type": "USER_MESSAGE", "content": "hi"}', token=token)[0] == 201
    text = prose(8_000_000)
    body = json.dumps({"type": "USER_MESSAGE", "content": text}).encode()
    peak, (status, answer) = least_traced_peak(
        lambda _: post_asgi(path, body, token=token, chunked=chunked), limit=3 * len(body)
    )
    assert status == 201, answer
    # The bytes, then the text they decode to, then the parsed content: never all three.
    # Before: the raw body kept on the request, the decoded text, the parsed content, a
    # UTF-8 copy to check it, and the answer rendered twice (≈ 4x; 5x chunked).
    assert peak <= 3 * len(body), f"{peak / len(body):.2f}x the body"
    stored = Event.objects.get(pk=answer["id"])
    assert stored.content == text
    counter = tokens.counter_for_model("gpt-4o")
    assert stored.token_count == tokens.message_tokens(counter, role="user", content=text)


def test_it_answers_an_append_without_a_content_over_the_bound(alice_api, session):
    path = f"{SESSIONS}/{session}/events"
    long_text = "x" * (APPEND_ANSWER_MAX_CONTENT_CHARS + 1)
    parts = [{"type": "text", "text": "y" * APPEND_ANSWER_MAX_CONTENT_CHARS}]
    at_bound = "z" * APPEND_ANSWER_MAX_CONTENT_CHARS
    sent = [
        {"type": "USER_MESSAGE", "content": long_text},
        {"type": "USER_MESSAGE", "content": parts},
        {"type": "USER_MESSAGE", "content": at_bound},
    ]
    response = alice_api.post(path, sent, format="json")
    assert response.status_code == 201
    answered = response.json()
    # A long text, and structured content whose JSON text is long: shown as null; one at
    # the bound is echoed. Every other field is there as for any event.
    assert [event["content"] for event in answered] == [None, None, at_bound]
    assert set(answered[0]) == set(answered[1]) == set(answered[2])
    # Stored whole, and read whole.
    fetched = alice_api.get(f"{path}/{answered[0]['id']}").json()
    assert fetched["content"] == long_text
    assert alice_api.get(f"{path}/{answered[1]['id']}").json()["content"] == parts
    # An identical retry is answered the same way (200).
    single = {"id": answered[0]["id"], **sent[0]}
    retried = alice_api.post(path, single, format="json")
    assert retried.status_code == 200 and retried.json()["content"] is None
    # With a new large event beside it: the careful way stores that one.
    mixed = alice_api.post(
        path, [single, {"type": "USER_MESSAGE", "content": long_text + "!"}], format="json"
    )
    assert mixed.status_code == 201
    assert [event["content"] for event in mixed.json()] == [None, None]
    assert Event.objects.get(pk=mixed.json()[1]["id"]).content == long_text + "!"


def resident_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise LookupError("VmRSS")


@pytest.mark.skipif(parsers._malloc_trim() is None, reason="glibc's malloc_trim only")
def test_it_gives_back_the_memory_freed_while_a_body_arrived():
    # As daphne hands a body over: 8 KiB pieces, all at once, between other allocations that
    # outlive them (so the freed pieces cannot fall back into the top of the heap).
    pieces, others = [], []
    for _ in range(4000):
        pieces.append(bytes(8192))
        others.append(bytes(600))
    del pieces
    before = resident_bytes()
    parsers.release_freed_memory(32_000_000)
    # At least a page of most pieces (a piece and its header straddle pages).
    assert before - resident_bytes() > 8_000_000
