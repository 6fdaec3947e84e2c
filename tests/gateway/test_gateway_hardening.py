"""What a provider or a client can send that the ledger cannot hold as it came: numbers past a
double's range, NUL and lone surrogates, impossible usage figures, a plain answer to a
streamed request, and paths that climb out of the upstream's base. The gateway is a proxy
first: the call goes through, and what is recorded renders on every read (see decisions.md).
Raw HTTP (httpx) where the SDKs cannot send or read what is tested."""

from __future__ import annotations

import http.client
import json
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from compaction_app.testkit.provider_standin import Step, reply_text
from sessions_app.models import Event, Session, Thread
from tests.support.gateway_live import CANARY, openai_client, token_for, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

CHAT = "/gateway/openai/v1/chat/completions"
MESSAGES = "/gateway/anthropic/v1/messages"


def _post(base: str, path: str, raw: bytes, *, key: str, session: str) -> httpx.Response:
    return httpx.post(
        base + path,
        content=raw,
        headers={
            "Content-Type": "application/json",
            "Authorization": f"Bearer {CANARY}",
            "x-api-key": CANARY,
            "anthropic-version": "2023-06-01",
            "X-Ledger-Key": key,
            "X-Ledger-Session": session,
        },
        timeout=30,
    )


def _assert_reads_render(api: Any, session_id: str) -> list[dict[str, Any]]:
    """Every read of the session answers 200 with JSON; returns its events."""
    base = f"/api/v1/sessions/{session_id}"
    for method, path, body in [
        ("get", "/events", None),
        ("get", "/context", None),
        ("get", "/context?format=anthropic", None),
        ("post", "/context", {}),
        ("post", "/recall", {"query": "hello"}),
        ("get", "/usage", None),
    ]:
        response = getattr(api, method)(base + path, body, format="json")
        assert response.status_code == 200, (path, response.content)
    events: list[dict[str, Any]] = api.get(f"{base}/events").json()["results"]
    for event in events:
        one = api.get(f"{base}/events/{event['id']}")
        assert one.status_code == 200, one.content
    return events


# --- a number past a double's range in a request ------------------------------------------


def test_it_forwards_and_records_a_content_part_holding_1e400(
    gateway_url, upstream, alice, alice_api
):
    key = token_for(alice)
    chat = (
        b'{"model": "gpt-4o", "messages": [{"role": "user", "content": ['
        b'{"type": "text", "text": "hello"},'
        b'{"type": "image_url", "image_url": {"url": "https://example.test/a.png"},'
        b' "score": 1e400, "low": -2E+999}]}]}'
    )
    answer = _post(gateway_url, CHAT, chat, key=key, session="big-numbers")
    assert answer.status_code == 200, answer.text
    # Forwarded byte for byte, the number as it was written.
    assert upstream.requests[-1].raw == chat
    claude = (
        b'{"model": "claude-3.5-sonnet", "max_tokens": 5, "messages": [{"role": "user",'
        b' "content": [{"type": "text", "text": "hello"}, {"type": "image", "source":'
        b' {"type": "url", "url": "https://example.test/b.png"}, "weight": 1e400}]}]}'
    )
    answer = _post(gateway_url, MESSAGES, claude, key=key, session="big-numbers-claude")
    assert answer.status_code == 200, answer.text
    assert upstream.requests[-1].raw == claude

    for name, part, field, text in [
        ("big-numbers", 1, "score", "1e400"),
        ("big-numbers-claude", 1, "weight", "1e400"),
    ]:
        session = Session.objects.get(owner=alice, client_key=name)
        events = _assert_reads_render(alice_api, str(session.pk))
        user = next(e for e in events if e["type"] == "USER_MESSAGE")
        # Recorded as the text it was sent as, noted on the event.
        assert user["content"][part][field] == text
        assert user["metadata"]["replaced"] == ["non_finite_number"]
        assert any(e["type"] == "AGENT_MESSAGE" for e in events)
    low = Event.objects.get(session__client_key="big-numbers", type="USER_MESSAGE")
    assert '"low":"-2E+999"' in low.content


# --- NUL and lone surrogates in a reply ---------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("odd", ["\x00", "\ud800"])
def test_it_records_a_reply_holding_nul_or_a_lone_surrogate_and_the_conversation_goes_on(
    gateway_url, upstream, alice, alice_api, odd, stream
):
    text = f"before{odd}after"
    upstream.script(reply_text(text), reply_text("Second answer."))
    client = openai_client(gateway_url, key=token_for(alice), session="odd-reply")
    history: list[dict[str, Any]] = [{"role": "user", "content": "hello there"}]
    if stream:
        chunks = client.chat.completions.create(model="gpt-4o", messages=history, stream=True)
        said = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    else:
        said = client.chat.completions.create(model="gpt-4o", messages=history)
        said = said.choices[0].message.content
    # Delivered as the provider sent it.
    assert said == text
    session = Session.objects.get(owner=alice, client_key="odd-reply")
    reply = wait_until(lambda: Event.objects.filter(session=session, type="AGENT_MESSAGE").first())
    assert reply.content == "before\ufffdafter"
    assert reply.metadata["replaced"] == ["nul" if odd == "\x00" else "lone_surrogate"]

    # The client's next call holds that reply in its history: forwarded, same thread. Sent
    # as JSON escapes (the SDK cannot encode a lone surrogate; a JavaScript client sends one).
    history += [{"role": "assistant", "content": said}, {"role": "user", "content": "go on"}]
    raw = json.dumps({"model": "gpt-4o", "messages": history}).encode()
    second = _post(gateway_url, CHAT, raw, key=token_for(alice), session="odd-reply")
    assert second.status_code == 200, second.text
    assert second.json()["choices"][0]["message"]["content"] == "Second answer."
    assert upstream.requests[-1].body["messages"] == history
    wait_until(lambda: Event.objects.filter(session=session, type="AGENT_MESSAGE").count() == 2)
    events = _assert_reads_render(alice_api, str(session.pk))
    assert [(e["type"], e["content"]) for e in events] == [
        ("USER_MESSAGE", "hello there"),
        ("AGENT_MESSAGE", "before\ufffdafter"),
        ("USER_MESSAGE", "go on"),
        ("AGENT_MESSAGE", "Second answer."),
    ]
    assert Thread.objects.filter(session=session).count() == 1


def test_it_forwards_and_records_a_request_message_holding_nul(
    gateway_url, upstream, alice, alice_api
):
    history = [{"role": "user", "content": "tab\x00separated \ud83d"}]
    raw = json.dumps({"model": "gpt-4o", "messages": history}).encode()
    answer = _post(gateway_url, CHAT, raw, key=token_for(alice), session="odd-request")
    assert answer.status_code == 200, answer.text
    assert upstream.requests[-1].raw == raw
    session = Session.objects.get(owner=alice, client_key="odd-request")
    events = _assert_reads_render(alice_api, str(session.pk))
    assert events[0]["content"] == "tab\ufffdseparated \ufffd"
    assert events[0]["metadata"]["replaced"] == ["lone_surrogate", "nul"]


# --- usage figures no reply holds, and a plain answer to a streamed request ---------------


def _openai_answer(usage_json: bytes) -> bytes:
    return (
        b'{"id": "chatcmpl-x", "object": "chat.completion", "created": 0, "model": "gpt-4o",'
        b' "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant",'
        b' "content": "Counted."}}], "usage": ' + usage_json + b"}"
    )


@pytest.mark.parametrize(
    ("usage_json", "kept", "dropped"),
    [
        (
            b'{"prompt_tokens": 10000000000000, "completion_tokens": 3, "total_tokens": 4}',
            {"completionTokens": 3, "totalTokens": 4},
            {"promptTokens"},
        ),
        (
            b'{"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13,'
            b' "prompt_tokens_details": {"cached_tokens": 50}}',
            {"promptTokens": 10, "completionTokens": 3, "totalTokens": 13},
            {"cachedInputTokens"},
        ),
        (
            b'{"prompt_tokens": 1e400, "completion_tokens": 3, "total_tokens": -1E999}',
            {"completionTokens": 3},
            {"promptTokens", "totalTokens"},
        ),
    ],
)
def test_it_records_a_reply_whose_usage_figures_are_out_of_range(
    gateway_url, upstream, alice, alice_api, usage_json, kept, dropped
):
    upstream.script(Step(kind="raw", raw_body=_openai_answer(usage_json)))
    client = openai_client(gateway_url, key=token_for(alice), session="odd-usage")
    answer = client.chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "hello"}]
    )
    assert answer.choices[0].message.content == "Counted."
    session = Session.objects.get(owner=alice, client_key="odd-usage")
    events = _assert_reads_render(alice_api, str(session.pk))
    reply = events[-1]
    assert reply["type"] == "AGENT_MESSAGE" and reply["content"] == "Counted."
    figures = {k: v for k, v in (reply["tokenUsage"] or {}).items() if v is not None}
    assert kept.items() <= figures.items(), figures
    assert set(reply["metadata"].get("usageDropped", {})) == dropped
    # The provider's own usage object stays as it came (a number past a double as its text).
    assert reply["metadata"]["usage"] == json.loads(usage_json, parse_float=_text_if_too_big)


def _text_if_too_big(text: str) -> Any:
    value = float(text)
    return text if value in (float("inf"), float("-inf")) else value


def test_it_records_a_plain_json_answer_to_a_streamed_request(
    gateway_url, upstream, alice, alice_api
):
    upstream.script(
        Step(
            kind="raw",
            raw_body=_openai_answer(
                b'{"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11}'
            ),
        )
    )
    body = {"model": "gpt-4o", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    answer = _post(
        gateway_url, CHAT, json.dumps(body).encode(), key=token_for(alice), session="plain"
    )
    assert answer.status_code == 200
    assert answer.json()["choices"][0]["message"]["content"] == "Counted."
    session = Session.objects.get(owner=alice, client_key="plain")
    reply = Event.objects.get(session=session, type="AGENT_MESSAGE")
    assert reply.content == "Counted."
    assert reply.prompt_tokens == 9


# --- passthrough paths that climb out of the upstream's base ------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "/gateway/openai/v1/..%2F..%2Fadmin",
        "/gateway/openai/v1/%2e%2e/%2e%2e/admin",
        "/gateway/openai/v1/files/%2E%2E%2F%2E%2E%2Fadmin",
        "/gateway/openai/v1/files/%252e%252e/admin",
        "/gateway/openai/v1/files/..%5C..%5Cadmin",
        "/gateway/anthropic/v1/..%2F..%2Fadmin",
        "/gateway/anthropic/%2e%2e/admin",
    ],
)
def test_it_refuses_a_passthrough_path_with_dot_segments(gateway_url, upstream, alice, path):
    parts = urlsplit(gateway_url)
    # http.client sends the path exactly as written (httpx would resolve the dots itself).
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        connection.request("GET", path, headers={"X-Ledger-Key": token_for(alice)})
        response = connection.getresponse()
        status, body = response.status, json.loads(response.read())
    finally:
        connection.close()
    assert status == 400, body
    if "/anthropic/" in path:
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    else:
        assert body["error"]["code"] == "invalid_path"
    assert upstream.requests == []


def test_it_still_passes_through_a_path_with_dots_inside_a_segment(gateway_url, upstream, alice):
    answer = httpx.get(
        f"{gateway_url}/gateway/openai/v1/responses/resp_a..b",
        headers={"X-Ledger-Key": token_for(alice), "Authorization": f"Bearer {CANARY}"},
        timeout=30,
    )
    assert answer.status_code == 200
    assert upstream.requests[-1].path == "/v1/responses/resp_a..b"


# --- what goes into a response header (issue 42, row 6) -------------------------------------

RESPONSES = "/gateway/openai/v1/responses"


def _conversation_body(path: str, model: str) -> bytes:
    if path == MESSAGES:
        body: dict[str, Any] = {
            "model": model,
            "max_tokens": 50,
            "messages": [{"role": "user", "content": "hello"}],
        }
    elif path == RESPONSES:
        body = {"model": model, "input": "hello"}
    else:
        body = {"model": model, "messages": [{"role": "user", "content": "hello"}]}
    # json.dumps writes a lone surrogate as its escape, as a client's JSON encoder would.
    return json.dumps(body).encode()


@pytest.mark.parametrize("bad", ["gpt\u0000-4o", "gpt\ud800-4o", "gpt\n-4o", "gpt\x7f-4o"])
@pytest.mark.parametrize("path", [CHAT, RESPONSES, MESSAGES])
def test_it_refuses_a_model_name_no_header_can_carry_and_records_the_call(
    gateway_url, upstream, alice, path, bad
):
    """Issue 42, row 6: on an existing session, `"model": "gpt\\u0000-4o"` was forwarded and its
    NUL went into X-Ledger-Model (the SDK failed with `illegal header line`); a lone surrogate
    gave a 500 HTML page; neither the reply nor the call was recorded. Now: 400 invalid_model
    in the provider's shape, nothing forwarded, the call's row stored."""
    from sessions_app.models import Call

    key = token_for(alice)
    good = "claude-3-5-sonnet-20241022" if path == MESSAGES else "gpt-4o"
    first = _post(gateway_url, path, _conversation_body(path, good), key=key, session="headers")
    assert first.status_code == 200, first.text
    forwarded = len(upstream.requests)
    answer = _post(gateway_url, path, _conversation_body(path, bad), key=key, session="headers")
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error.get("code") == "invalid_model"
    if path != MESSAGES:
        assert error["param"] == "model"
    else:
        assert answer.json()["type"] == "error"
    assert len(upstream.requests) == forwarded
    session = Session.objects.get(owner=alice, client_key="headers")
    refused = wait_until(lambda: Call.objects.filter(session=session, status="refused").first())
    assert refused.http_status == 400 and refused.error_code == "invalid_model"
    assert refused.model_requested.startswith("gpt") or refused.model_requested.startswith("claude")
    # The conversation goes on.
    again = _post(gateway_url, path, _conversation_body(path, good), key=key, session="headers")
    assert again.status_code == 200, again.text


@pytest.mark.parametrize("model", ["gem%00ini-2.5-pro", "gem%0Aini-2.5-pro", "gem%7Fini"])
def test_it_refuses_a_gemini_model_in_the_path_no_header_can_carry(
    gateway_url, upstream, alice, model
):
    from sessions_app.models import Call

    key = token_for(alice)
    body = json.dumps({"contents": [{"role": "user", "parts": [{"text": "hello"}]}]}).encode()
    headers = {
        "Content-Type": "application/json",
        "x-goog-api-key": CANARY,
        "X-Ledger-Key": key,
        "X-Ledger-Session": "gemini-headers",
    }
    ok = httpx.post(
        f"{gateway_url}/gateway/gemini/v1beta/models/gemini-2.5-pro:generateContent",
        content=body,
        headers=headers,
        timeout=30,
    )
    assert ok.status_code == 200, ok.text
    forwarded = len(upstream.requests)
    parts = urlsplit(gateway_url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    connection.request(
        "POST", f"/gateway/gemini/v1beta/models/{model}:generateContent", body, headers
    )
    answer = connection.getresponse()
    data = answer.read()
    connection.close()
    assert answer.status == 400, data
    assert json.loads(data)["error"]["status"] == "INVALID_ARGUMENT"
    assert len(upstream.requests) == forwarded
    session = Session.objects.get(owner=alice, client_key="gemini-headers")
    wait_until(lambda: Call.objects.filter(session=session, status="refused").exists())


# --- usage figures bounded once, for the reply's events and its call's row (issue 42, row 4) ---


def _anthropic_answer(usage_json: bytes) -> bytes:
    return (
        b'{"id": "msg_x", "type": "message", "role": "assistant", "model": '
        b'"claude-3-5-sonnet-20241022", "content": [{"type": "text", "text": "Counted."}],'
        b' "stop_reason": "end_turn", "usage": ' + usage_json + b"}"
    )


@pytest.mark.parametrize(
    ("path", "answer", "dropped"),
    [
        (
            CHAT,
            _openai_answer(
                b'{"prompt_tokens": 10000000000000, "completion_tokens": 100000000000000}'
            ),
            {"promptTokens", "completionTokens"},
        ),
        (
            CHAT,
            _openai_answer(
                b'{"prompt_tokens": 10000000000000000000, "completion_tokens": '
                b"10000000000000000000000000, "
                b'"total_tokens": 5, "prompt_tokens_details": {"cached_tokens": -3}}'
            ),
            {"promptTokens", "completionTokens", "cachedInputTokens"},
        ),
        (
            MESSAGES,
            _anthropic_answer(b'{"input_tokens": 10000000000000000000, "output_tokens": 7}'),
            {"promptTokens", "totalTokens"},
        ),
        (
            MESSAGES,
            _anthropic_answer(b'{"input_tokens": -4, "output_tokens": 1e400}'),
            {"promptTokens", "completionTokens"},
        ),
        (
            # Issue 41 prices compaction iterations apart: one past the bound must not reach
            # the bill around the bounded whole (its row was lost to a bigint overflow).
            MESSAGES,
            _anthropic_answer(
                b'{"input_tokens": 10, "output_tokens": 7, "iterations": [{"type": '
                b'"compaction", "input_tokens": 10000000000000000000, "output_tokens": 5}]}'
            ),
            {"promptTokens", "totalTokens", "iterations"},
        ),
        (
            CHAT,
            _openai_answer(
                b'{"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13,'
                b' "completion_tokens_details": {"reasoning_tokens": 10000000000000000000}}'
            ),
            {"reasoningTokens"},
        ),
    ],
)
def test_it_bounds_usage_once_for_the_reply_and_the_calls_row(
    gateway_url, upstream, alice, alice_api, path, answer, dropped
):
    """Issue 42, row 4: usage of 10^13 / 10^14 went into the calls ledger raw (`costUsd`
    700,000,000); 10^19 / 10^25 lost the call's row (`bigint out of range`); Anthropic's
    impossible figures became 0 without a `usageDropped` note. Now the same bound drops each
    such figure from the reply's event and the call's row alike, and both name it."""
    from sessions_app.models import Call

    upstream.script(Step(kind="raw", raw_body=answer))
    body = _conversation_body(path, "claude-3-5-sonnet-20241022" if path == MESSAGES else "gpt-4o")
    response = _post(gateway_url, path, body, key=token_for(alice), session="huge-usage")
    assert response.status_code == 200, response.text
    session = Session.objects.get(owner=alice, client_key="huge-usage")
    call = wait_until(lambda: Call.objects.filter(session=session).first())
    assert call.status == "ok"
    for figure in (
        call.prompt_tokens,
        call.completion_tokens,
        call.cached_input_tokens,
        call.reasoning_tokens,
    ):
        assert figure is None or figure <= 10**12
    assert set(call.usage_dropped) == dropped
    reply = Event.objects.get(session=session, type="AGENT_MESSAGE")
    assert set(reply.metadata["usageDropped"]) == dropped
    if reply.prompt_tokens is None and reply.completion_tokens is None:
        # Every figure dropped: no usable usage, so the call is priced at the gateway's own
        # count, marked as an estimate (issue 41), never at 0; the reply's event holds none.
        assert (call.usage_status, call.cost_estimated) == ("absent", True)
        assert call.prompt_tokens and call.prompt_tokens < 1000
        assert call.completion_tokens and call.completion_tokens < 1000
    else:
        assert call.usage_status == "reported" and not call.cost_estimated
        assert reply.prompt_tokens == call.prompt_tokens
        assert reply.completion_tokens == call.completion_tokens
    listed = alice_api.get(f"/api/v1/sessions/{session.pk}/calls").json()
    assert set(listed["results"][0]["usageDropped"]) == dropped
    assert listed["summary"]["costUsd"] < 10
    assert alice_api.get(f"/api/v1/sessions/{session.pk}/usage").json()["costUsd"] < 10
